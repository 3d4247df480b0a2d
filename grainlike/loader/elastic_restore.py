"""Elastic restore: a DataLoader state continues on another number of workers or processes.

A DataLoader's workers split the shard's positions round-robin (worker ``w`` of
``W`` reads ``w, w + W, ...``) and each batches its own records, so what a
checkpoint has delivered is, per worker, a prefix of its positions: all
positions below a *frontier* (the first position not delivered) and a few above
it. Restoring onto ``W'`` workers starts each new worker at its first position
at or above the frontier and skips the delivered positions above it: every
record the checkpointed job had not delivered is delivered once, nothing is
delivered twice. The skipped positions travel in the state (as sampler global
indices, ``state.SKIP_KEY``; in each worker's Dataset state as its own
positions, which its reading stage does not deliver: ``dataset.elastic.SkippingReader``)
until every worker has passed them.

Across a change of JAX process count (``N`` -> ``M`` shards of an
``IndexSampler``), positions of the old shards name other records than those of
the new ones, so the merge is by record: for each epoch, the records the old
shards delivered; each new shard skips those of its own records.

Guarantees and limits are in "Elastic restore" in ``docs/checkpointing.md``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from grainlike.core.errors import InvalidStateError
from grainlike.core.sharding import strided_shard_size
from grainlike.loader import legacy_state as state_lib
from grainlike.loader.legacy_state import assign, frontier


# -- another number of processes -------------------------------------------------------

_SHARD_OPTIONS = re.compile(r"\b\w+\((shard_index=\d+, shard_count=\d+, drop_remainder=(?:True|False))\)")


def _without_shard_class(text: str) -> str:
    """A sampler's repr with every shard options' class written ``ShardOptions``.

    ``ShardByJaxProcess()`` of process ``i`` of ``N`` and ``ShardOptions(i, N)``
    shard alike; which one wrote a state does not matter to a restore.
    """
    return _SHARD_OPTIONS.sub(r"ShardOptions(\1)", text)


def process_states(
    loader: Any, states: Mapping[int, Any], process_count: int
) -> state_lib.Positions:
    """Positions of ``loader`` (one of ``M`` processes) continuing ``N`` processes' states.

    Args:
      loader: the DataLoader of this process; its sampler must be a grainlike
        ``IndexSampler`` sharded as the loader is (``ShardByJaxProcess`` or
        ``ShardOptions``), so that each old shard's records can be recomputed.
      states: every old process's state (legacy JSON bytes, str or object), by
        its process index ``0..N-1``.
      process_count: ``N``.

    Returns:
      This loader's positions: the first record of its shard not delivered by the
      old processes, skipping the delivered records after it.

    Raises:
      InvalidStateError: a state is missing, malformed, or of another pipeline; or
        the sampler cannot be re-sharded.
    """
    return sampler_process_states(loader.sampler, loader._codec, states, process_count)


def sampler_process_states(
    sampler: Any, codec: state_lib.LegacyState, states: Mapping[int, Any], process_count: int
) -> state_lib.Positions:
    """``process_states`` for a loader of ``sampler`` whose states ``codec`` converts."""
    from grainlike.core.samplers import IndexSampler

    if not isinstance(sampler, IndexSampler):
        raise InvalidStateError(
            f"cannot restore a checkpoint of {process_count} processes on "
            f"{codec.shard_count}: the sampler {sampler!r} is not an IndexSampler, whose "
            "records per shard grainlike can recompute for another number of shards"
        )
    if sampler.shard_options.shard_count != codec.shard_count or (
        sampler.shard_options.shard_index != codec.shard_index
    ):
        raise InvalidStateError(
            "cannot restore on another number of processes: the DataLoader shards with "
            f"shard {codec.shard_index} of {codec.shard_count}, its sampler with "
            f"{sampler.shard_options!r}; shard both alike (ShardByJaxProcess)"
        )
    missing = sorted(set(range(process_count)) - set(states))
    if missing:
        raise InvalidStateError(
            f"the checkpoint of {process_count} processes lacks the state of process(es) "
            f"{missing}: a restore on another number of processes needs all of them"
        )
    olds = []
    for i in range(process_count):
        old_sampler = _shard_sampler(sampler, i, process_count)
        data = states[i] if isinstance(states[i], dict) else state_lib.parse(states[i])
        if not isinstance(data, dict) or "sampler" not in data or "worker_count" not in data:
            raise InvalidStateError(f"the state of process {i} of {process_count} is not a DataLoader state")
        if not isinstance(data["sampler"], str) or _without_shard_class(data["sampler"]) != repr(old_sampler):
            raise InvalidStateError(
                f"the state of process {i} of {process_count} is of another sampler: "
                f"{data['sampler']!r}; this loader's sampler, sharded as that process, is "
                f"{old_sampler!r}"
            )
        count = data["worker_count"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidStateError(f"the state of process {i} has worker_count {count!r}")
        old_codec = _shard_codec(codec, old_sampler, count, data["sampler"])
        positions = old_codec.decode(data)
        olds.append((old_sampler, old_codec, *frontier(old_codec, positions)))
    if codec.shard_count == 1:
        return assign(codec, *_new_frontier(sampler, codec, olds))
    return _equal_shares(sampler, codec, olds, process_count)


def _shard_sampler(sampler: Any, index: int, count: int) -> Any:
    """``sampler`` (an ``IndexSampler``) as shard ``index`` of ``count`` has it."""
    from grainlike.core import sharding
    from grainlike.core.samplers import IndexSampler

    options = sharding.ShardOptions(index, count, sampler.shard_options.drop_remainder)
    return IndexSampler(
        sampler.num_records, options, shuffle=sampler.shuffle, num_epochs=sampler.num_epochs, seed=sampler.seed
    )


def _shard_codec(codec: state_lib.LegacyState, sampler: Any, worker_count: int, sampler_repr: str) -> state_lib.LegacyState:
    """The states of ``sampler``'s shard (``_shard_sampler``) read by ``worker_count`` workers."""
    options = sampler.shard_options
    return state_lib.LegacyState(
        worker_count=worker_count,
        shard_index=options.shard_index,
        shard_count=options.shard_count,
        sampler_repr=sampler_repr,
        data_source_repr=codec.data_source_repr,
        worker_lengths=tuple(state_lib.worker_lengths(strided_shard_size(len(sampler), options), worker_count)),
    )


def _equal_shares(sampler: Any, codec: state_lib.LegacyState, olds: list, process_count: int) -> state_lib.Positions:
    """This process's positions, with every new process delivering equal shares.

    The delivered records fall unevenly on the ``M`` new shards, so each new
    process would have another number of records left: another number of
    batches, or a last batch of another shape, from which no global array can be
    built. Every process computes all ``M`` shares alone from the same old
    states. Equal shares (per worker, and the same worker first) go on as they
    are. Otherwise, with ``drop_remainder=True`` sharding each worker of each
    process drops its last records of the epoch under way down to the smallest
    share among the processes (as ``drop_remainder`` drops records so that all
    shards are equal); without it the restore is refused.

    Raises:
      InvalidStateError: the shares differ and the sharding keeps remainders.
    """
    m = codec.shard_count
    w = max(codec.worker_count, 1)
    drop = sampler.shard_options.drop_remainder
    shares = []
    seen_by_epoch: dict = {}
    for j in range(m):
        if j == codec.shard_index:
            sampler_j, codec_j = sampler, codec
        else:
            sampler_j = _shard_sampler(sampler, j, m)
            codec_j = _shard_codec(codec, sampler_j, codec.worker_count, repr(sampler_j))
        f, above = _new_frontier(sampler_j, codec_j, olds, seen_by_epoch)
        shares.append((sampler_j, codec_j, f, above, _worker_counts(codec_j, f, above)))
    counts = np.asarray([share[4] for share in shares])
    first = [share[2] % w if codec.worker_count else 0 for share in shares]
    _, _, f, above, mine = shares[codec.shard_index]
    positions = assign(codec, f, above)
    if (counts == counts[0]).all() and len(set(first)) == 1:
        return positions
    if not drop:
        totals = " / ".join(f"{int(c):,}" for c in counts.sum(axis=1))
        raise InvalidStateError(
            f"restoring the states of {process_count} processes on {m}: the new processes "
            f"would deliver different numbers of records ({totals}), so different numbers "
            "or shapes of batches, and no global array could be built from them. Shard with "
            "drop_remainder=True (grain.ShardByJaxProcess(drop_remainder=True)) to drop each "
            "process's extra records of the epoch under way, as drop_remainder drops records "
            "to make shards equal"
        )
    target = counts.min(axis=0)
    n = sampler._shard_size
    skip = [np.asarray(above, dtype=np.int64)]
    end = min(codec.local_length, (max([f, *above]) // n + 1) * n) if n > 0 else codec.local_length
    for worker in range(w):
        extra = int(mine[worker] - target[worker])
        if extra <= 0:
            continue
        # The worker's last positions not delivered, in the epoch(s) under way.
        start = f + (worker - f) % w
        ahead = np.arange(start, end, w, dtype=np.int64)[::-1]
        ahead = ahead[~np.isin(ahead, skip[0])]
        skip.append(ahead[:extra])
    positions = assign(codec, f, np.unique(np.concatenate(skip)).tolist())
    positions.next_worker = min(first)
    return positions


def _worker_counts(codec: state_lib.LegacyState, f: int, above: Sequence[int]) -> list[int]:
    """Per worker of ``codec``, the positions it has left from ``f`` on, less ``above``."""
    w = max(codec.worker_count, 1)
    counts = []
    for worker, length in enumerate(codec.worker_lengths):
        first = max(0, -(-(f - worker) // w))
        counts.append(max(0, length - first))
    for p in above:
        if p < codec.local_length:
            counts[p % w] -= 1
    return counts


def _epoch_keys(sampler: Any, codec: state_lib.LegacyState, positions: np.ndarray) -> np.ndarray:
    global_indices = positions.astype(np.int64) * codec.shard_count + codec.shard_index
    return np.asarray(sampler.locate(global_indices).keys, dtype=np.int64)


def _new_frontier(
    sampler: Any, codec: state_lib.LegacyState, olds: list, seen_by_epoch: Optional[dict] = None
) -> tuple[int, list[int]]:
    """This shard's frontier and delivered positions above it, from the old shards'.

    ``seen_by_epoch`` keeps the records the old shards delivered per epoch (the
    same for every new shard) between calls for several new shards.
    """
    if seen_by_epoch is None:
        seen_by_epoch = {}
    n_new = sampler._shard_size
    if n_new <= 0:
        return 0, []
    # Per old shard: its records per epoch, and epochs it has wholly delivered.
    sizes = [old_sampler._shard_size for old_sampler, *_ in olds]
    done = min((f // n if n > 0 else 10**18) for (_, _, f, _), n in zip(olds, sizes))
    if sum(max(n, 0) for n in sizes) < sampler.num_records:
        # The old shards dropped records (drop_remainder): no epoch of theirs
        # delivered every record, so every epoch is compared record by record.
        done = 0
    last = max(
        ((max([f - 1, *above]) // n) if n > 0 else -1) for (_, _, f, above), n in zip(olds, sizes)
    )
    start = min(done * n_new, codec.local_length)
    delivered: list[np.ndarray] = []
    for epoch in range(done, last + 1):
        seen = seen_by_epoch.get(epoch)
        if seen is None:
            seen = seen_by_epoch[epoch] = _delivered_in_epoch(sampler.num_records, olds, sizes, epoch)
        lo, hi = epoch * n_new, min((epoch + 1) * n_new, codec.local_length)
        if lo >= hi:
            break
        ours = np.arange(lo, hi, dtype=np.int64)
        delivered.append(ours[seen[_epoch_keys(sampler, codec, ours)]])
    done_positions = set(np.concatenate(delivered).tolist()) if delivered else set()
    f = start
    while f in done_positions:
        f += 1
    return f, sorted(p for p in done_positions if p > f)


def _delivered_in_epoch(num_records: int, olds: list, sizes: list, epoch: int) -> np.ndarray:
    """Per record key, whether an old shard delivered it in ``epoch``."""
    seen = np.zeros(num_records, dtype=bool)
    for (old_sampler, old_codec, f, above), n in zip(olds, sizes):
        if n <= 0:
            continue
        lo, hi = epoch * n, min((epoch + 1) * n, old_codec.local_length)
        prefix = np.arange(lo, max(lo, min(f, hi)), dtype=np.int64)
        extra = np.asarray([p for p in above if lo <= p < hi], dtype=np.int64)
        mine = np.concatenate([prefix, extra])
        if mine.size:
            seen[_epoch_keys(old_sampler, old_codec, mine)] = True
    return seen
