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
from grainlike.loader import elastic_restore as elastic
from grainlike.loader.legacy_state import dumps

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
    after, shapes = [], []
    for j in range(new):
        loader = _loader(records, j, new, shuffle)
        with iter(loader) as it:
            it.set_state(dumps(loader._codec.encode(elastic.process_states(loader, states, old))))
            batches = list(it)
        after += _values(batches)
        shapes.append([np.shape(b) for b in batches])
    got = collections.Counter(before + after)
    # Every new process delivers batches of the same shapes (the sharding drops
    # each one's extra records of the epoch under way, as drop_remainder does).
    assert all(s == shapes[0] for s in shapes), shapes
    # No record twice; every record the new split covers in every epoch, except
    # the few dropped in the epoch under way; records the old split dropped but
    # the new one covers are delivered by the new job.
    covered = set()
    for j in range(new):
        start, end = even_split(records, grain.ShardOptions(j, new, drop_remainder=True))
        covered |= set(range(start, end))
    assert not got - collections.Counter(list(range(records)) * EPOCHS), "a record came twice"
    assert all(got[r] >= EPOCHS - 1 for r in covered), sorted(r for r in covered if got[r] < EPOCHS - 1)
    if new == 1:
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
        shard = grain.ShardOptions(index, count, drop_remainder=True)
        return grain.DataLoader(
            data_source=grain.RangeDataSource(0, records, 1),
            sampler=grain.IndexSampler(records, shard, shuffle=shuffle, num_epochs=1, seed=3),
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
    # Equal shares: each process's extra records of the epoch are dropped. Shuffled,
    # the delivered records spread evenly and few are dropped; in order, whole
    # blocks of a new shard were delivered, and the shares differ by thousands.
    assert len(after) % new == 0
    if shuffle:
        covered = {v for j in range(new) for v in _values(loader(j, new))}
        assert len(covered - set(got)) < 0.01 * records


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


def _shard_loader(records, index, count, drop, workers):
    return grain.DataLoader(
        data_source=grain.RangeDataSource(0, records, 1),
        sampler=grain.IndexSampler(
            records, grain.ShardOptions(index, count, drop_remainder=drop), shuffle=True, num_epochs=1, seed=9
        ),
        operations=[grain.Batch(7)],
        worker_count=workers,
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_after_a_restore_on_other_processes_every_process_has_the_same_batch_shapes(no_leaks, workers):
    # 4 processes deliver 20 batches each of 1,000 records; 3 go on. Unequal shares
    # (the records delivered fall unevenly on the new shards) would give each
    # process another number of batches and another last batch: DeviceIterator
    # could then build global arrays of different shapes on each process.
    records = 1000
    before, states = [], {}
    for i in range(4):
        with iter(_shard_loader(records, i, 4, True, workers)) as it:
            before += _values(next(it) for _ in range(20 // max(workers, 1)))
            states[i] = it.get_state()
    shapes, after = [], []
    for j in range(3):
        loader = _shard_loader(records, j, 3, True, workers)
        with iter(loader) as it:
            it.set_state(dumps(loader._codec.encode(elastic.process_states(loader, states, 4))))
            batches = list(it)
        shapes.append([np.shape(b) for b in batches])
        after += _values(batches)
    assert shapes[0] == shapes[1] == shapes[2], [s[-3:] for s in shapes]
    got = collections.Counter(before + after)
    assert max(got.values()) == 1, "a record came twice"
    # Dropped: each process's extra records of the epoch, at most the spread of shares.
    assert records - 1 - 3 * 7 * max(workers, 1) * 4 <= len(got) <= records


@pytest.mark.timeout(60)
def test_unequal_shares_without_drop_remainder_are_refused_before_the_first_step(no_leaks):
    records = 1000
    states = {}
    for i in range(4):
        with iter(_shard_loader(records, i, 4, False, 0)) as it:
            for _ in range(20):
                next(it)
            states[i] = it.get_state()
    loader = _shard_loader(records, 0, 3, False, 0)
    with pytest.raises(InvalidStateError, match=r"would deliver different numbers of records \([\d,]+ / [\d,]+ / [\d,]+\).*drop_remainder=True"):
        elastic.process_states(loader, states, 4)
    # On one process there is nothing to match: every record once.
    one = _shard_loader(records, 0, 1, False, 0)
    with iter(one) as it:
        it.set_state(dumps(one._codec.encode(elastic.process_states(one, states, 4))))
        assert len(_values(it)) == records - 4 * 20 * 7
