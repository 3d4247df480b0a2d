"""The merge of N processes' states into one of M processes, computed in one process.

Each process's loader is built here with the ShardOptions that process would
have (the real multi-process runs are in test_process_count.py).
"""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

import grainlike as grain
from grainlike.core.errors import InvalidStateError
from grainlike.core.sharding import even_split
from grainlike.loader import elastic
from grainlike.loader.state import dumps

EPOCHS = 2


def _loader(records: int, index: int, count: int, shuffle: bool = True, workers: int = 0) -> grain.DataLoader:
    return grain.DataLoader(
        data_source=grain.RangeDataSource(0, records, 1),
        sampler=grain.IndexSampler(
            records, grain.ShardOptions(index, count, drop_remainder=True), shuffle=shuffle, num_epochs=EPOCHS, seed=3
        ),
        operations=[grain.Batch(2)],
        worker_count=workers,
    )


def _values(batches) -> list:
    return [int(v) for b in batches for v in np.asarray(b).reshape(-1)]


def _save(records: int, n: int, steps: int, shuffle: bool, workers: int = 0) -> tuple[list, dict]:
    before, states = [], {}
    for i in range(n):
        with iter(_loader(records, i, n, shuffle, workers)) as it:
            before += _values(next(it) for _ in range(steps))
            states[i] = it.get_state()
    return before, states


@pytest.mark.timeout(60)
@pytest.mark.parametrize("records", [24, 25])  # 25: the 2- and 3-process splits drop records
@pytest.mark.parametrize("old, new, steps", [(2, 1, 8), (1, 2, 5), (2, 3, 3), (3, 2, 5), (3, 1, 1)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_processes_states_merge_into_another_process_count(no_leaks, records, old, new, steps, shuffle):
    before, states = _save(records, old, steps, shuffle)
    after = []
    for j in range(new):
        loader = _loader(records, j, new, shuffle)
        with iter(loader) as it:
            it.set_state(dumps(loader._codec.encode(elastic.process_states(loader, states, old))))
            after += _values(it)
    got = collections.Counter(before + after)
    # Every record the new split covers, each epoch, once; records the old split
    # dropped but the new one covers are delivered by the new job.
    covered = set()
    for j in range(new):
        start, end = even_split(records, grain.ShardOptions(j, new, drop_remainder=True))
        covered |= set(range(start, end))
    assert not got - collections.Counter(list(range(records)) * EPOCHS), "a record came twice"
    assert all(got[r] == EPOCHS for r in covered), sorted(r for r in covered if got[r] != EPOCHS)


@pytest.mark.timeout(60)
def test_states_of_workers_merge_too(no_leaks):
    before, states = _save(24, 2, 3, True, workers=2)
    loader = _loader(24, 0, 1, workers=3)
    with iter(loader) as it:
        it.set_state(dumps(loader._codec.encode(elastic.process_states(loader, states, 2))))
        after = _values(it)
    assert collections.Counter(before + after) == collections.Counter(list(range(24)) * EPOCHS)


@pytest.mark.timeout(60)
def test_missing_or_foreign_process_state_is_refused(no_leaks):
    _, states = _save(24, 2, 1, True)
    loader = _loader(24, 0, 1)
    with pytest.raises(InvalidStateError, match=r"lacks the state of process\(es\) \[1\]"):
        elastic.process_states(loader, {0: states[0]}, 2)
    other = _loader(24, 0, 1, shuffle=False)
    with pytest.raises(InvalidStateError, match="of another sampler"):
        elastic.process_states(other, states, 2)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shuffle", [True, False])
def test_state_after_a_restore_onto_other_processes_stays_a_few_kb(no_leaks, shuffle):
    # 100k records, 4 processes deliver 10k each (40k), then 3 processes go on.
    # Each new process skips the records delivered in its shard above its first
    # undelivered one: ~8-13k of them, 58-92 KB as a plain list of indices.
    records, old, new = 100_000, 4, 3

    def loader(index, count):
        return grain.DataLoader(
            data_source=grain.RangeDataSource(0, records, 1),
            sampler=grain.IndexSampler(records, grain.ShardOptions(index, count), shuffle=shuffle, num_epochs=1, seed=3),
            operations=[grain.Batch(1000)],
        )

    before, states = [], {}
    for i in range(old):
        with iter(loader(i, old)) as it:
            before += _values(next(it) for _ in range(10))
            states[i] = it.get_state()
    after = []
    for j in range(new):
        new_loader = loader(j, new)
        with iter(new_loader) as it:
            it.set_state(dumps(new_loader._codec.encode(elastic.process_states(new_loader, states, old))))
            state = it.get_state()
            skipped = len(new_loader._codec.decode(json.loads(state)).skip)
            assert skipped > 5000
            # Shuffled: a bitmap over the span still to read (~5 KB); in order: a few runs.
            assert len(state) < (8000 if shuffle else 1000), len(state)
            after += _values(it)
            assert "skip_indices" not in json.loads(it.get_state())
    got = collections.Counter(before + after)
    assert max(got.values()) == 1, "a record came twice"
    # Every record the 3-process split delivers (100k // 3 per shard) is delivered.
    covered = {v for j in range(new) for v in _values(loader(j, new))}
    assert covered <= set(got)


@pytest.mark.timeout(60)
def test_a_plain_skip_list_of_earlier_states_still_restores(no_leaks):
    before, states = _save(24, 2, 3, True)
    loader = _loader(24, 0, 1)
    data = loader._codec.encode(elastic.process_states(loader, states, 2))
    positions = loader._codec.decode(data)
    assert positions.skip, "this restore skips records"
    data["skip_indices"] = list(positions.skip)  # as written before runs and bitmaps
    with iter(loader) as it:
        it.set_state(dumps(data))
        after = _values(it)
    assert collections.Counter(before + after) == collections.Counter(list(range(24)) * EPOCHS)
