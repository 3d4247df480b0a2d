"""The DataLoader's checkpoint state in grain 0.2.18's legacy JSON format.

``last_seen_indices[str(i)] = shard_index - G + i * S + next_i * G`` with
``G = max(W, 1) * S``; ``last_worker_index`` is the worker that produced last in
the round-robin cycle, -1 when the next one is worker 0. See "State" in
``docs/concepts.md``.

Below the loader's top stage the state is the Dataset API's: with no workers the
reading stage's ``{"next_index": n}``, with workers ``mp_prefetch``'s dict holding
one such state per worker. ``LegacyState`` converts between the two, and checks a
legacy state completely before anything is restored from it.

Elastic restore (see "Elastic restore" in ``docs/checkpointing.md``): a state
of another worker count is restored by ``rebalance`` (and one of another process
count by ``grainlike.loader.elastic_restore``): every worker's delivered positions are merged, and the new workers start at the first
position not delivered, skipping the few delivered above it. While such skipped
positions are pending, the state carries them as sampler global indices under
``SKIP_KEY`` (grain ignores the key), as runs or a bitmap (``core/index_set.py``);
otherwise it is grain's state, byte for byte.

A source of remote objects (``grainlike.sources.protocol.PinsRemoteObjects``)
adds the versions it reads under ``OBJECTS_KEY`` (grain ignores the key too), so
a restore reads those versions or refuses clearly; local sources' states have no
such key.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

# One class for every iterator's refused state, DataLoader and Dataset stages alike.
from grainlike.core import index_set
from grainlike.core.errors import InvalidStateError
from grainlike.dataset.parallel.elastic import SKIP_KEY as WORKER_SKIP_KEY, round_robin_frontier

STATE_VERSION = 2
# Global indices delivered above some worker's position, not to deliver again.
SKIP_KEY = "skip_indices"
# The versions of the remote objects the source reads: {url: pin}.
OBJECTS_KEY = "remote_objects"
# In each worker's Dataset state, WORKER_SKIP_KEY: its own positions to skip.
_KEYS = ("last_seen_indices", "last_worker_index", "worker_count", "sampler", "data_source")


@dataclasses.dataclass
class Positions:
    """Where each worker is: the next position it reads, and whose turn is next.

    ``skip``: sorted sampler global indices above the workers' positions that
    were delivered already (after an elastic restore); they are not read again.
    """

    next_positions: list[int]
    next_worker: int
    skip: tuple[int, ...] = ()


def source_repr(source: Any) -> str:
    """How a source is named in the state: grain's rule (no data in the state)."""
    import numpy as np

    if isinstance(source, (list, tuple, np.ndarray)):
        return str(type(source))
    return repr(source)


def worker_lengths(local_length: int, worker_count: int) -> list[int]:
    """How many shard-local positions each worker reads (worker ``w``: ``w, w + W, ...``)."""
    w = max(worker_count, 1)
    return [max(0, (local_length - i + w - 1) // w) for i in range(w)]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class StateJSONError(InvalidStateError, json.JSONDecodeError):
    """A state that is not JSON: a ``json.JSONDecodeError`` (what grain raises) and an ``InvalidStateError``.

    Its ``msg``, ``doc``, ``pos``, ``lineno`` and ``colno`` are the decoder's.
    """

    def __init__(self, message: str, error: json.JSONDecodeError):
        json.JSONDecodeError.__init__(self, error.msg, error.doc, error.pos)
        self.args = (message,)

    def __reduce__(self):
        return _state_json_error, (self.args[0], self.msg, self.doc, self.pos)


def _state_json_error(message: str, msg: str, doc: str, pos: int) -> StateJSONError:
    return StateJSONError(message, json.JSONDecodeError(msg, doc, pos))


def parse(state: Any) -> dict:
    """The JSON object of ``get_state()`` bytes (or str) of grain or grainlike.

    Raises:
      TypeError: ``state`` is not bytes or str.
      InvalidStateError: it is not UTF-8 JSON holding an object (``StateJSONError``,
        a ``json.JSONDecodeError`` as grain raises, where it is not JSON).
    """
    if isinstance(state, (bytes, bytearray, memoryview)):
        try:
            text = bytes(state).decode()
        except UnicodeDecodeError as e:
            raise InvalidStateError(f"state is not UTF-8 text: {e}") from None
    elif isinstance(state, str):
        text = state
    else:
        raise TypeError(
            f"set_state expects the bytes returned by get_state(), got {type(state).__name__}"
        )
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        # ValueError: JSONDecodeError, and also an int literal longer than Python's
        # int-from-string limit (4300 digits).
        head = text[:60] + ("..." if len(text) > 60 else "")
        message = f"state is not valid JSON ({e}): {head!r}"
        if isinstance(e, json.JSONDecodeError):
            raise StateJSONError(message, e) from None
        raise InvalidStateError(message) from None
    if not isinstance(data, dict):
        raise InvalidStateError(f"state must be a JSON object, got {type(data).__name__}")
    return data


def dumps(state: dict) -> bytes:
    """The bytes ``get_state()`` returns for a legacy state: grain's formatting."""
    return json.dumps(state, indent=4).encode()


@dataclasses.dataclass(frozen=True)
class LegacyState:
    """Converts one loader's states: legacy JSON object <-> positions <-> Dataset state.

    Attributes:
      worker_count: the loader's worker count (0: in process).
      shard_index, shard_count: the loader's sharding.
      sampler_repr, data_source_repr: how the state names the sampler and source.
      worker_lengths: how many positions each worker reads in all.
    """

    worker_count: int
    shard_index: int
    shard_count: int
    sampler_repr: str
    data_source_repr: str
    worker_lengths: Sequence[int]

    @property
    def _w(self) -> int:
        return max(self.worker_count, 1)

    def encode(self, positions: Positions) -> dict:
        """grain's legacy state (a JSON object) of ``positions``."""
        g = self._w * self.shard_count
        last_seen = {
            str(i): int(self.shard_index - g + i * self.shard_count + positions.next_positions[i] * g)
            for i in range(self._w)
        }
        state = {
            "version": STATE_VERSION,
            "last_seen_indices": last_seen,
            "last_worker_index": positions.next_worker - 1,
            "worker_count": self.worker_count,
            "sampler": self.sampler_repr,
            "data_source": self.data_source_repr,
        }
        skip = self.pending_skip(positions)
        if skip:
            state[SKIP_KEY] = index_set.encode(skip, step=self.shard_count)
        return state

    def local_position(self, global_index: int) -> int:
        """The shard-local position of a sampler global index of this shard."""
        return (global_index - self.shard_index) // self.shard_count

    def global_index(self, position: int) -> int:
        """The sampler global index of a shard-local position."""
        return position * self.shard_count + self.shard_index

    def pending_skip(self, positions: Positions) -> list[int]:
        """The skipped global indices that no worker has passed yet."""
        w = self._w
        out = []
        for g in positions.skip:
            p = self.local_position(g)
            if p // w >= positions.next_positions[p % w]:
                out.append(int(g))
        return out

    @property
    def local_length(self) -> int:
        """How many positions the shard has."""
        return sum(self.worker_lengths)

    def decode(self, data: Any) -> Positions:
        """The positions of a legacy state, checked completely against this loader.

        Raises:
          InvalidStateError: the state is malformed or belongs to another pipeline.
        """
        if not isinstance(data, dict):
            raise InvalidStateError(f"state must be a JSON object, got {type(data).__name__}")
        missing = [k for k in _KEYS if k not in data]
        if missing:
            raise InvalidStateError(f"state is missing the field(s) {missing}")
        version = data.get("version", STATE_VERSION)
        if not _is_int(version) or version > STATE_VERSION or version < 1:
            raise InvalidStateError(
                f"state version {version!r} is not supported (this version reads versions "
                f"1 to {STATE_VERSION})"
            )
        elastic = (
            _is_int(data["worker_count"])
            and data["worker_count"] >= 0
            and data["worker_count"] != self.worker_count
        )
        if not _is_int(data["worker_count"]) or (data["worker_count"] != self.worker_count and not elastic):
            raise InvalidStateError(
                "Worker count in checkpoint does not match dataloader worker count.\n"
                f"worker count in checkpoint: {data['worker_count']}\n"
                f"worker count in dataloader: {self.worker_count}"
            )
        if data["sampler"] != self.sampler_repr:
            raise InvalidStateError(
                "Sampler in checkpoint does not match dataloader sampler.\n"
                f"sampler in checkpoint: {data['sampler']}\n"
                f"sampler in dataloader: {self.sampler_repr}\n"
                "Grain uses `repr(sampler)` to validate the sampler, so you "
                "may need to implement a custom `__repr__`."
            )
        if data["data_source"] != self.data_source_repr:
            raise InvalidStateError(
                "DataSource in checkpoint does not match datasource in dataloader.\n"
                f"data source in checkpoint: {data['data_source']}\n"
                f"data source in dataloader: {self.data_source_repr}\n"
                "Grain uses `repr(data_source)` to validate the source, so you "
                "may need to implement a custom `__repr__`."
            )
        if elastic:
            last_seen = data["last_seen_indices"]
            if not isinstance(last_seen, dict) or len(last_seen) != max(data["worker_count"], 1):
                raise InvalidStateError(
                    f"last_seen_indices must map each worker of the state's worker_count "
                    f"{data['worker_count']} to an index, got {last_seen!r}"
                )

            old = dataclasses.replace(
                self,
                worker_count=data["worker_count"],
                worker_lengths=tuple(worker_lengths(self.local_length, data["worker_count"])),
            )
            return rebalance(old, old.decode_positions(data), self)
        return self.decode_positions(data)

    def decode_positions(self, data: dict) -> Positions:
        """The positions in ``data``, a legacy state of this worker count and shard.

        Raises:
          InvalidStateError: a position or skipped index is not one of this shard's.
        """
        w = self._w
        last_seen = data["last_seen_indices"]
        if not isinstance(last_seen, dict) or sorted(last_seen) != sorted(str(i) for i in range(w)):
            raise InvalidStateError(
                f"last_seen_indices must map each worker '0'..'{w - 1}' to an index, "
                f"got {last_seen!r}"
            )
        g = w * self.shard_count
        positions = []
        for i in range(w):
            value = last_seen[str(i)]
            if not _is_int(value):
                raise InvalidStateError(f"last_seen_indices['{i}'] must be an int, got {value!r}")
            offset = value + g - self.shard_index - i * self.shard_count
            if offset % g:
                raise InvalidStateError(
                    f"last_seen_indices['{i}'] = {value} is not an index worker {i} of "
                    f"{w} in shard {self.shard_index} of {self.shard_count} can have produced"
                )
            pos = offset // g
            if pos < 0 or pos > self.worker_lengths[i]:
                raise InvalidStateError(
                    f"last_seen_indices['{i}'] = {value} is out of range: worker {i} "
                    f"reads {self.worker_lengths[i]} positions, the state says {pos} were read"
                )
            positions.append(pos)
        last_worker = data["last_worker_index"]
        if not _is_int(last_worker) or not -1 <= last_worker < w:
            raise InvalidStateError(
                f"last_worker_index must be an int in [-1, {w - 1}], got {last_worker!r}"
            )
        next_worker = (last_worker + 1) % w if self.worker_count else 0
        skip = index_set.decode(data.get(SKIP_KEY, []), f"state[{SKIP_KEY!r}]", self.local_length)
        for g in skip:
            p = self.local_position(g)
            if (g - self.shard_index) % self.shard_count or not 0 <= p < self.local_length:
                raise InvalidStateError(
                    f"{SKIP_KEY} holds {g}, which is not a global index of shard "
                    f"{self.shard_index} of {self.shard_count} ({self.local_length} positions)"
                )
            if p // w < positions[p % w]:
                raise InvalidStateError(
                    f"{SKIP_KEY} holds {g}, which worker {p % w} has read already "
                    f"(it is at position {positions[p % w]})"
                )
        return Positions(next_positions=positions, next_worker=next_worker, skip=tuple(sorted(set(skip))))

    def from_dataset_state(self, state: dict) -> Positions:
        """The positions in the state of the stage below the loader's top."""
        workers = [state] if self.worker_count == 0 else state["iterators_in_use_states"]
        w = self._w
        skip = [self.global_index(i + q * w) for i, s in enumerate(workers) for q in s.get(WORKER_SKIP_KEY, ())]
        cycle = 0 if self.worker_count == 0 else state["next_index_in_cycle"]
        return Positions([s["next_index"] for s in workers], cycle, tuple(sorted(skip)))

    def _worker_state(self, positions: Positions, worker: int) -> dict:
        # The skip list is always given, empty too: the skipping stage keeps its
        # list when a state comes without one (a rewind after an error).
        w = self._w
        local = (self.local_position(g) for g in positions.skip)
        skip = [p // w for p in local if p % w == worker]
        return {"next_index": positions.next_positions[worker], WORKER_SKIP_KEY: skip}

    def to_dataset_state(self, positions: Positions) -> dict:
        """The state of the stage below the loader's top at ``positions`` (as grain builds it)."""
        if self.worker_count == 0:
            return self._worker_state(positions, 0)
        w = self.worker_count
        return {
            "next_index_in_cycle": positions.next_worker,
            "next_index_in_datasets": w,
            "iterators_in_use_indices": list(range(w)),
            "iterators_in_use_states": [self._worker_state(positions, i) for i in range(w)],
            "exhausted": [0] * w,
            "future_states": {},
        }


def encode(
    positions: Positions,
    worker_count: int,
    shard_index: int,
    shard_count: int,
    sampler_repr: str,
    data_source_repr: str,
) -> bytes:
    """The state as grain's ``get_state()`` bytes."""
    codec = LegacyState(worker_count, shard_index, shard_count, sampler_repr, data_source_repr, ())
    return dumps(codec.encode(positions))


def decode(
    state: Any,
    *,
    worker_count: int,
    shard_index: int,
    shard_count: int,
    sampler_repr: str,
    data_source_repr: str,
    worker_lengths: list[int],
) -> Positions:
    """Parses and validates ``state``; raises before anything is changed."""
    codec = LegacyState(
        worker_count, shard_index, shard_count, sampler_repr, data_source_repr, tuple(worker_lengths)
    )
    return codec.decode(parse(state))


# -- another number of workers ----------------------------------------------------------


def frontier(codec: LegacyState, positions: Positions) -> tuple[int, list[int]]:
    """What ``positions`` delivered, as shard-local positions.

    Returns:
      ``(f, above)``: every position below ``f`` was delivered, ``f`` was not, and
      ``above`` (sorted) are the delivered positions above ``f``.

    Raises:
      InvalidStateError: the workers are too far apart (no state a DataLoader writes).
    """
    skipped = [codec.local_position(g) for g in positions.skip]
    return round_robin_frontier(positions.next_positions, skipped, "cannot restore on another worker count")


def assign(codec: LegacyState, f: int, above: Sequence[int]) -> Positions:
    """Positions of ``codec``'s workers that deliver every position >= ``f`` not in ``above``."""
    w = max(codec.worker_count, 1)
    lengths = codec.worker_lengths
    next_positions = [min(lengths[i], max(0, -(-(f - i) // w))) for i in range(w)]
    next_worker = f % w if codec.worker_count else 0
    skip = tuple(codec.global_index(p) for p in above if p < codec.local_length)
    return Positions(next_positions, next_worker, skip)


def rebalance(old: LegacyState, positions: Positions, new: LegacyState) -> Positions:
    """``positions`` of ``old``'s workers, moved onto ``new``'s workers (same shard)."""
    return assign(new, *frontier(old, positions))
