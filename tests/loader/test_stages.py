"""The DataLoader as Dataset stages: the sampler stage, operations on records, the state stage."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import grainlike as grain
from grainlike.core.record import LazyRng, Record
from grainlike.dataset.conformance import assert_equal_output_after_checkpoint
from grainlike.loader.records import SamplerMapDataset

pytestmark = pytest.mark.timeout(60)


class Plus(grain.MapTransform):
    def map(self, x):
        return x + 100


class Noise(grain.RandomMapTransform):
    def random_map(self, x, rng):
        return (x, int(rng.integers(1 << 30)))


class FailOnceAt(grain.MapTransform):
    """Raises once at record ``bad``; a marker file remembers it, across processes."""

    def __init__(self, bad, marker):
        self.bad, self.marker = bad, str(marker)

    def map(self, x):
        if x == self.bad and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            raise OSError(f"record {x} failed once")
        return x


class CountingSource:
    """A list source that records every batched read."""

    def __init__(self, n):
        self.n, self.reads = n, []

    def __len__(self):
        return self.n

    def __getitem__(self, key):
        return key * 10

    def __getitems__(self, keys):
        self.reads.append(list(keys))
        return [k * 10 for k in keys]

    def __repr__(self):
        return f"CountingSource(n={self.n})"


def _loader(n=20, ops=(), workers=0, shuffle=True, epochs=1, shard=(0, 1), source=None, seed=3):
    return grain.DataLoader(
        data_source=list(range(n)) if source is None else source,
        sampler=grain.IndexSampler(n, grain.ShardOptions(*shard), shuffle=shuffle, num_epochs=epochs, seed=seed),
        operations=list(ops),
        worker_count=workers,
    )


@pytest.mark.parametrize("shard", [(0, 1), (1, 3)])
def test_sampler_stage_reads_a_chunk_with_one_locate_and_one_batched_read(shard):
    source = CountingSource(30)
    sampler = grain.IndexSampler(30, grain.ShardOptions(*shard), shuffle=True, num_epochs=2, seed=7)
    ds = SamplerMapDataset(source, sampler, grain.ShardOptions(*shard))
    assert len(ds) == len(sampler) // shard[1]
    records = ds._getitems(range(3, 9))
    assert len(source.reads) == 1
    for i, r in zip(range(3, 9), records):
        expected = sampler[i * shard[1] + shard[0]]
        assert (r.metadata.index, r.metadata.record_key) == (expected.index, expected.record_key)
        assert r.data == expected.record_key * 10
        # The rng is a placeholder until a random transform asks for it.
        assert type(r.metadata._rng) is LazyRng
        assert r.metadata.rng.random() == expected.rng.random()


def test_a_sliced_sampler_stage_is_still_one_sampler_stage():
    source = CountingSource(40)
    sampler = grain.IndexSampler(40, grain.NoSharding(), shuffle=True, num_epochs=1, seed=1)
    ds = SamplerMapDataset(source, sampler, grain.NoSharding())
    sliced = ds[1::3][2::2]  # positions 1, 4, 7, ... then every other from the third
    assert type(sliced) is SamplerMapDataset
    positions = list(range(40))[1::3][2::2]
    assert len(sliced) == len(positions)
    got = sliced._getitems(range(len(sliced)))
    assert [r.metadata.index for r in got] == positions
    assert [r.metadata.record_key for r in got] == [sampler[p].record_key for p in positions]
    assert [sliced[i].metadata.index for i in range(len(sliced))] == positions


def test_a_sampler_with_only_grains_protocol_is_located_through_the_contract():
    class MySampler:
        def __len__(self):
            return 6

        def __getitem__(self, i):
            if not 0 <= i < 6:
                raise IndexError(i)
            return grain.RecordMetadata(index=i, record_key=5 - i)

    ds = SamplerMapDataset(list("abcdef"), MySampler(), grain.NoSharding())
    assert [r.data for r in ds._getitems(range(6))] == list("fedcba")


@pytest.mark.parametrize("workers", [0, 2])
def test_records_get_no_rng_unless_a_random_transform_asks(no_leaks, workers):
    def check_no_rng(records):
        for r in records:
            assert type(r.metadata._rng) is LazyRng, r.metadata
            yield r

    with iter(_loader(12, [Plus(), check_no_rng, grain.Batch(4)], workers=workers)) as it:
        assert sorted(np.concatenate(list(it)).tolist()) == list(range(100, 112))
    # A random transform draws from the record's own rng: seed + global index.
    sampler = grain.IndexSampler(12, grain.NoSharding(), shuffle=True, num_epochs=1, seed=3)
    expected = {sampler[i].record_key: int(sampler[i].rng.integers(1 << 30)) for i in range(12)}
    with iter(_loader(12, [Noise()], workers=workers)) as it:
        assert dict(it) == expected


@pytest.mark.parametrize("workers", [0, 2])
def test_after_an_error_next_goes_on_from_the_last_delivered_output(no_leaks, tmp_path, workers):
    ops = [FailOnceAt(13, tmp_path / "failed"), grain.Batch(4)]
    with iter(_loader(24, ops[1:], workers=workers)) as it:
        expected = [b.tolist() for b in it]
    got = []
    with iter(_loader(24, ops, workers=workers)) as it:
        with pytest.raises(OSError, match="failed once") as info:
            while True:
                got.append(next(it).tolist())
        assert "record_key 13" in "\n".join(info.value.__notes__)
        # The batch cut short by the error is read again, whole.
        got.extend(b.tolist() for b in it)
    assert got == expected


def test_a_legacy_operation_runs_only_when_outputs_are_asked_for(no_leaks, tmp_path):
    calls = tmp_path / "calls"

    def op(records):
        with open(calls, "a") as f:
            f.write(f"{os.getpid()}\n")
        yield from records

    loader = _loader(10, [op, grain.Batch(2)], workers=2)
    with iter(loader) as it:
        state = it.get_state()
        it.set_state(state)
        assert not calls.exists()  # reading and checking states runs no user code
        assert len(list(it)) == 6
    pids = {int(p) for p in calls.read_text().split()}
    assert pids and os.getpid() not in pids


def test_a_legacy_operation_starts_again_on_the_restored_records():
    def pairs(records):
        # Holds a record back across outputs, as a legacy batching operation would.
        records = iter(records)
        for a in records:
            b = next(records, None)
            yield a if b is None else Record(b.metadata, (a.data, b.data))

    assert_equal_output_after_checkpoint(_loader(9, [pairs], shuffle=False))


def test_set_state_on_a_closed_iterator_starts_it_again_there():
    loader = _loader(10, [grain.Batch(3)])
    it = iter(loader)
    first = next(it)
    state = it.get_state()
    rest = [b.tolist() for b in it]
    it.close()
    with pytest.raises(RuntimeError, match="closed"):
        next(it)
    it.set_state(state)
    assert [b.tolist() for b in it] == rest
    assert first.tolist() != rest[0]
    it.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_state_below_the_top_is_the_dataset_apis(no_leaks, workers):
    loader = _loader(10, [grain.Batch(2)], workers=workers, shard=(1, 2), epochs=2)
    with iter(loader) as it:
        below = it._iterator._parent
        for _ in range(3):
            next(it)
        legacy = json.loads(it.get_state())
        state = below.get_state()
    g = max(workers, 1) * 2
    if workers == 0:
        positions, turn = [state["next_index"]], 0
    else:
        assert state["iterators_in_use_indices"] == list(range(workers))
        positions = [s["next_index"] for s in state["iterators_in_use_states"]]
        turn = state["next_index_in_cycle"]
    # grain's rule from the positions to the legacy state.
    assert legacy["last_seen_indices"] == {str(i): 1 - g + i * 2 + p * g for i, p in enumerate(positions)}
    assert legacy["last_worker_index"] == turn - 1


def test_close_and_get_state_from_another_thread_do_not_wait_for_a_blocked_next(no_leaks):
    import time

    from grainlike.core.errors import ClosedIteratorError
    from tests.helpers.threads import next_in_thread
    from tests.reliability.transforms import StuckAt

    it = iter(_loader(8, [StuckAt(0), grain.Batch(2)], workers=2, shuffle=False))
    consumer, outcome = next_in_thread(it)
    time.sleep(1.0)  # next() now waits for worker 0, stuck on record 0
    assert consumer.is_alive()
    start = time.monotonic()
    assert json.loads(it.get_state())["last_seen_indices"] == {"0": -2, "1": -1}
    it.close()
    assert time.monotonic() - start < 6.0
    consumer.join(5.0)
    assert not consumer.is_alive()
    assert isinstance(outcome.get("error"), ClosedIteratorError), outcome
