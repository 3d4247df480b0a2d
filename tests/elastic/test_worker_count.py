"""A DataLoader state restores on another worker count: every record delivered once.

For each pair of worker counts (0, 1, 2, 3), a job is checkpointed at several
steps (before the first batch, inside the first round of workers, after it,
mid-epoch) and restored with the other count; the records delivered before the
checkpoint and after the restore are the epochs' records, each once.
"""

from __future__ import annotations

import collections
import itertools
import json

import numpy as np
import pytest

import grainlike as grain
from grainlike.loader.legacy_state import SKIP_KEY

COUNTS = (0, 1, 2, 3)
CHECKPOINTS = (0, 1, 2, 3, 5)


def _transforms():
    """The transforms, made in a function: workers unpickle them by value (no test module import)."""

    class DropMultiplesOf3(grain.FilterTransform):
        def filter(self, x):
            return x % 3 != 0

    class Plus100(grain.MapTransform):
        def map(self, x):
            return x + 100

    return DropMultiplesOf3(), Plus100()


DROP_MULTIPLES_OF_3, PLUS_100 = _transforms()


# name: (records, epochs, operations, drop_remainder)
CONFIGS = {
    "shuffle_batch": (24, 1, lambda: [grain.Batch(3)], False),
    "filter_batch_drop_2_epochs": (
        30,
        2,
        lambda: [PLUS_100, DROP_MULTIPLES_OF_3, grain.Batch(4, drop_remainder=True)],
        True,
    ),
    "unbatched": (10, 1, lambda: [DROP_MULTIPLES_OF_3], False),
}


def _loader(config: str, workers: int) -> grain.DataLoader:
    n, epochs, ops, _ = CONFIGS[config]
    return grain.DataLoader(
        data_source=grain.RangeDataSource(0, n, 1),
        sampler=grain.IndexSampler(n, grain.NoSharding(), shuffle=True, num_epochs=epochs, seed=7),
        operations=ops(),
        worker_count=workers,
    )


def _expected(config: str) -> collections.Counter:
    n, epochs, ops, _ = CONFIGS[config]
    values = [k for k in range(n)] * epochs
    for op in ops():
        if isinstance(op, grain.MapTransform):
            values = [op.map(v) for v in values]
        elif isinstance(op, grain.FilterTransform):
            values = [v for v in values if op.filter(v)]
    return collections.Counter(values)


def _records(outputs) -> list:
    return [int(v) for out in outputs for v in np.asarray(out).reshape(-1)]


def _checkpoints(config: str, workers: int) -> list[tuple[list, bytes]]:
    """(records delivered, state) at each step of CHECKPOINTS, from one run."""
    out = []
    with iter(_loader(config, workers)) as it:
        delivered = []
        for step in range(max(CHECKPOINTS) + 1):
            if step in CHECKPOINTS:
                out.append((list(delivered), it.get_state()))
            delivered.extend(_records([next(it)]))
    return out


def _assert_exactly_once(config: str, before: list, after: list, new_workers: int) -> None:
    expected = _expected(config)
    got = collections.Counter(before) + collections.Counter(after)
    assert not got - expected, f"delivered twice or unknown: {sorted((got - expected).elements())}"
    missing = sum((expected - got).values())
    if CONFIGS[config][3]:
        # Only the new job's last partial batch per worker is dropped.
        assert missing < 4 * max(new_workers, 1)
    else:
        assert missing == 0, f"never delivered: {sorted((expected - got).elements())}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_restore_on_other_worker_count_delivers_rest_exactly_once(no_leaks, config):
    saved = {w: _checkpoints(config, w) for w in COUNTS}
    for new in COUNTS:
        with iter(_loader(config, new)) as it:
            for old in COUNTS:
                if old == new:
                    continue
                for before, state in saved[old]:
                    it.set_state(state)
                    after = _records(list(it))
                    _assert_exactly_once(config, before, after, new)


@pytest.mark.timeout(60)
def test_pending_skips_travel_in_the_state_and_restore_again(no_leaks):
    # 3 workers, checkpoint after worker 0's first batch: positions 3 and 6 of
    # worker 0 were delivered above the first position not delivered (1).
    (before, state), = [c for i, c in enumerate(_checkpoints("shuffle_batch", 3)) if CHECKPOINTS[i] == 1]
    with iter(_loader("shuffle_batch", 2)) as it:
        it.set_state(state)
        data = json.loads(it.get_state())
        assert data["worker_count"] == 2 and data[SKIP_KEY] == {"step": 1, "ranges": [[3, 4], [6, 7]]}
        middle = _records([next(it)])
        pending = it.get_state()
        assert SKIP_KEY in json.loads(pending)
    with iter(_loader("shuffle_batch", 0)) as it:
        it.set_state(pending)
        rest = []
        for out in it:
            rest += _records([out])
            if SKIP_KEY not in json.loads(it.get_state()):
                break
        # Once every skipped position is passed the state is grain's again.
        assert set(json.loads(it.get_state())) == {
            "version",
            "last_seen_indices",
            "last_worker_index",
            "worker_count",
            "sampler",
            "data_source",
        }
        rest += _records(list(it))
    _assert_exactly_once("shuffle_batch", before + middle, rest, 0)


@pytest.mark.timeout(60)
def test_restore_on_other_worker_count_after_the_epoch_delivers_nothing(no_leaks):
    with iter(_loader("shuffle_batch", 2)) as it:
        list(it)
        state = it.get_state()
    with iter(_loader("shuffle_batch", 3)) as it:
        it.set_state(state)
        assert list(it) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "edit, match",
    [
        ({SKIP_KEY: "3"}, "must be a list of ints"),
        ({SKIP_KEY: {"step": 1, "ranges": [[0, 10**12]]}}, r"skip_indices.*at most \d+ indices"),
        ({SKIP_KEY: {"step": 1, "start": 3, "count": 8, "bitmap": "!"}}, r"skip_indices.*not base64"),
        ({SKIP_KEY: [10**6]}, "not a global index"),
        ({SKIP_KEY: [0]}, "has read already"),
    ],
)
def test_bad_skip_list_is_refused(no_leaks, edit, match):
    (_, state), = [c for i, c in enumerate(_checkpoints("shuffle_batch", 0)) if CHECKPOINTS[i] == 1]
    bad = json.dumps({**json.loads(state), **edit}).encode()
    loader = _loader("shuffle_batch", 2)
    with iter(loader) as it:
        with pytest.raises(grain.InvalidStateError, match=match):
            it.set_state(bad)


@pytest.mark.timeout(60)
def test_warm_start_restores_on_another_worker_count(no_leaks):
    # The first outputs are computed in this process while the workers start:
    # they skip the same records the workers would.
    (before, state), = [c for i, c in enumerate(_checkpoints("shuffle_batch", 3)) if CHECKPOINTS[i] == 2]
    n, epochs, ops, _ = CONFIGS["shuffle_batch"]
    loader = grain.DataLoader(
        data_source=grain.RangeDataSource(0, n, 1),
        sampler=grain.IndexSampler(n, grain.NoSharding(), shuffle=True, num_epochs=epochs, seed=7),
        operations=ops(),
        worker_count=2,
        warm_start=True,
    )
    with iter(loader) as it:
        it.set_state(state)
        after = _records(list(it))
    _assert_exactly_once("shuffle_batch", before, after, 2)


@pytest.mark.timeout(60)
def test_error_after_restore_goes_on_without_repeating_or_losing_records(no_leaks):
    # A transform fails once while skipped records are pending; the next next()
    # starts the batch again and still skips them.
    (before, state), = [c for i, c in enumerate(_checkpoints("shuffle_batch", 3)) if CHECKPOINTS[i] == 1]

    class FailsOnce(grain.MapTransform):
        calls = 0

        def map(self, x):
            FailsOnce.calls += 1
            if FailsOnce.calls == 2:
                raise RuntimeError("flaky")
            return x

    n, epochs, _, _ = CONFIGS["shuffle_batch"]
    loader = grain.DataLoader(
        data_source=grain.RangeDataSource(0, n, 1),
        sampler=grain.IndexSampler(n, grain.NoSharding(), shuffle=True, num_epochs=epochs, seed=7),
        operations=[FailsOnce(), grain.Batch(3)],
        worker_count=0,
    )
    after = []
    with iter(loader) as it:
        it.set_state(state)
        with pytest.raises(RuntimeError, match="flaky"):
            next(it)
        assert SKIP_KEY in json.loads(it.get_state())
        after = _records(list(it))
    _assert_exactly_once("shuffle_batch", before, after, 0)
