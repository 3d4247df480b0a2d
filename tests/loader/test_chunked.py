"""The DataLoader's batches over maps and filters take whole chunks of records.

A batch over maps and filters over the reading of the sampler's records
(``ds.map`` / ``ds.filter`` / ``ds.batch``, read in process) takes chunks
(``grainlike/dataset/transformations/chunk.py``). It must be indistinguishable
from the same stages taking one record at a time (as after a flat map or a
legacy Operation; here forced with ``per_record=True``), whether the source is
read in the calling thread or in read threads: same batches, the same random
draws, the same state after every batch, the same errors at the same batch with
the same notes, and the same recovery after them. grain's outputs and states are
checked in tests/compat/test_chunked_loader_compat.py.
"""

from __future__ import annotations

import contextlib
from typing import Protocol, runtime_checkable
from unittest import mock

import numpy as np
import pytest

import grainlike
from grainlike.dataset.transformations import batch as batch_lib
from grainlike.dataset.transformations import filter as filter_lib
from grainlike.dataset.transformations import map as map_lib

N = 600  # Several chunks of 256 records.


class PlainSource:
    """A source of the user's own type that declares its reads local (``waits = False``).

    Without ReadOptions it is read in the calling thread; with
    ReadOptions(num_threads=2) in read threads.
    """

    waits = False

    def __init__(self, n: int = N, bad_key: int = -1):
        self.n = n
        self.bad_key = bad_key

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> int:
        if k == self.bad_key:
            raise KeyError(f"cannot read {k}")
        return k

    def __repr__(self) -> str:
        return f"PlainSource({self.n})"


def _ops(names, map_fail=None, filter_fail=None, batch_size=7, drop_remainder=False):
    class Boom(grainlike.MapTransform):
        def map(self, x):
            if x == map_fail:
                raise ValueError(f"boom at {x}")
            return x

    class Square(grainlike.MapTransform):
        def map(self, x):
            return {"x": np.int64(x), "sq": np.int64(x) * x}

    class Index(grainlike.MapWithIndexTransform):
        def map_with_index(self, i, x):
            return {**x, "i": i}

    class Noise(grainlike.RandomMapTransform):
        def random_map(self, x, rng):
            return {**x, "noise": rng.integers(0, 2**31)}

    class NotMultipleOf3(grainlike.FilterTransform):
        def filter(self, x):
            if x["x"] == filter_fail:
                raise RuntimeError(f"filter failed at {x['x']}")
            return x["x"] % 3 != 0

    class BatchNoise(grainlike.RandomMapTransform):
        def random_map(self, x, rng):  # draws from the batch's (its last record's) rng
            return {**x, "batch_noise": rng.random()}

    make = {
        "boom": Boom, "square": Square, "index": Index, "noise": Noise,
        "filter": NotMultipleOf3, "batch_noise": BatchNoise,
    }
    out = []
    for name in names:
        if name == "batch":
            out.append(grainlike.Batch(batch_size, drop_remainder=drop_remainder))
        else:
            out.append(make[name]())
    return out


@runtime_checkable
class _NoChunks(Protocol):
    def _no_such_method(self) -> None: ...


class _PerRecordLoader(grainlike.DataLoader):
    """A DataLoader whose stages take one record at a time: none of them sees a parent handing over chunks."""

    def __iter__(self):
        with contextlib.ExitStack() as stack:
            for module in (batch_lib, filter_lib, map_lib):
                stack.enter_context(mock.patch.object(module, "TakesChunks", _NoChunks))
            return super().__iter__()


def _loader(ops, *, threads: bool, per_record=False, shuffle=True, epochs=1, source=None, shard=None):
    sampler = grainlike.IndexSampler(
        N, shard or grainlike.NoSharding(), shuffle=shuffle, num_epochs=epochs, seed=5
    )
    read_options = grainlike.ReadOptions(num_threads=2, prefetch_buffer_size=16) if threads else None
    return (_PerRecordLoader if per_record else grainlike.DataLoader)(
        data_source=source or PlainSource(),
        sampler=sampler,
        operations=ops,
        worker_count=0,
        read_options=read_options,
        shard_options=shard,
    )


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in sorted(x.items())}
    if isinstance(x, np.ndarray):
        return (str(x.dtype), x.tolist())
    return x


def _run(loader, steps=200):
    """Outputs (or the error's type, message and notes) and the state after each step."""
    it = iter(loader)
    out = []
    for _ in range(steps):
        try:
            out.append(_plain(next(it)))
        except StopIteration:
            out.append("stop")
            break
        except Exception as e:  # noqa: BLE001 - the error is what is compared
            out.append(("error", type(e).__name__, str(e), list(getattr(e, "__notes__", []))))
        out.append(it.get_state())
    return out


def _stage_names(loader) -> list:
    it = iter(loader)
    names = []
    node = it._iterator
    while node is not None:
        names.append(type(node).__name__)
        parents = getattr(node, "_parents", ())
        node = parents[0] if parents else None
    it.close()
    return names


def test_maps_filters_batch_take_the_chunked_path_with_and_without_read_threads():
    ops = _ops(["square", "filter", "noise", "batch"])
    stages = ["_BatchDatasetIterator", "_MapChunksIterator", "_FilterChunksIterator", "_MapChunksIterator"]
    for threads in (False, True):
        # ds.map / ds.filter / ds.batch over to_iter_dataset()'s reading, the one every Dataset pipeline reads with.
        names = _stage_names(_loader(ops, threads=threads))
        assert names[-5:] == stages + ["ReadRecordsIterator"], names
    assert "_MapChunksIterator" not in _stage_names(_loader(ops, threads=True, per_record=True))


def test_the_chunked_reading_is_to_iter_datasets_reading():
    from grainlike.dataset.transformations.prefetch import PrefetchDatasetIterator

    it = iter(_loader(_ops(["square", "batch"]), threads=True))
    node = it._iterator
    while node._parents:
        node = node._parents[0]
    assert isinstance(node, PrefetchDatasetIterator) and node._threads == 2
    next(it)
    it.close()


CASES = [
    ["square", "batch"],
    ["square", "filter", "batch"],
    ["square", "noise", "index", "filter", "noise", "batch", "batch_noise"],
    ["boom", "square", "filter", "batch"],
    ["square", "filter", "index", "batch", "batch_noise"],
]


@pytest.mark.parametrize("drop_remainder", [False, True])
@pytest.mark.parametrize("names", CASES, ids=["-".join(c) for c in CASES])
def test_chunked_path_matches_per_record_stages(names, drop_remainder):
    chunked = _run(_loader(_ops(names, drop_remainder=drop_remainder), threads=False, epochs=2))
    per_record = _run(_loader(_ops(names, drop_remainder=drop_remainder), threads=True, per_record=True, epochs=2))
    in_threads = _run(_loader(_ops(names, drop_remainder=drop_remainder), threads=True, epochs=2))
    assert chunked == per_record == in_threads
    assert chunked[-1] == "stop"


@pytest.mark.parametrize("fail", ["map", "filter", "read"])
def test_errors_come_at_the_same_batch_and_the_next_call_retries(fail):
    names = ["boom", "square", "filter", "noise", "batch", "batch_noise"]
    # Key 400 sits in the second full chunk: the batches before it come first.
    ops = lambda: _ops(names, map_fail=400 if fail == "map" else None, filter_fail=400 if fail == "filter" else None)  # noqa: E731
    source = lambda: PlainSource(bad_key=400 if fail == "read" else -1)  # noqa: E731
    chunked = _run(_loader(ops(), threads=False, shuffle=False, source=source()), steps=60)
    per_record = _run(_loader(ops(), threads=True, per_record=True, shuffle=False, source=source()), steps=60)
    in_threads = _run(_loader(ops(), threads=True, shuffle=False, source=source()), steps=60)
    assert chunked == per_record == in_threads
    errors = [o for o in chunked if isinstance(o, tuple)]
    assert errors and all(e[1] == {"map": "ValueError", "filter": "RuntimeError", "read": "KeyError"}[fail] for e in errors)
    assert any("400" in note for note in errors[0][3])
    # The outputs before the first error are the full batches before key 400.
    first_error = chunked.index(errors[0])
    assert sum(1 for o in chunked[:first_error] if isinstance(o, dict) and "x" in o) == 400 * 2 // 3 // 7


@pytest.mark.parametrize("threads", [False, True])
@pytest.mark.parametrize("at", [0, 1, 2, 37, 38, 80])
def test_restore_anywhere_continues_identically(at, threads):
    names = ["square", "filter", "noise", "batch", "batch_noise"]
    loader = _loader(_ops(names), threads=threads, epochs=2)
    it = iter(loader)
    for _ in range(at):
        next(it)
    state = it.get_state()
    expected = [_plain(b) for b in it]
    restored = iter(_loader(_ops(names), threads=threads, epochs=2))
    restored.set_state(state)
    assert [_plain(b) for b in restored] == expected


def test_read_threads_end_when_the_iterator_is_closed_or_dropped():
    import gc
    import time

    from grainlike.core.errors import ClosedIteratorError
    from tests.helpers.threads import read_threads

    def threads_after(close: bool) -> set:
        before = read_threads()
        it = iter(_loader(_ops(["square", "batch"]), threads=True))
        next(it)
        assert read_threads() - before  # It reads ahead in threads of its own.
        if close:
            it.close()
            with pytest.raises(ClosedIteratorError):
                next(it)
        del it
        gc.collect()
        deadline = time.monotonic() + 10
        while read_threads() - before and time.monotonic() < deadline:
            time.sleep(0.02)
        return read_threads() - before

    assert not threads_after(close=True)
    assert not threads_after(close=False)


def test_sharded_and_sliced_records_match_per_record_stages():
    shard = grainlike.ShardOptions(shard_index=1, shard_count=3, drop_remainder=False)
    names = ["square", "filter", "noise", "batch"]
    chunked = _run(_loader(_ops(names), threads=False, shard=shard))
    per_record = _run(_loader(_ops(names), threads=True, per_record=True, shard=shard))
    assert chunked == per_record


def test_batches_of_python_ints_are_int64_arrays():
    ops = [grainlike.Batch(5)]
    loader = _loader(ops, threads=False, shuffle=False, source=grainlike.RangeDataSource(0, N, 1))
    batch = next(iter(loader))
    assert batch.dtype == np.int64 and batch.tolist() == [0, 1, 2, 3, 4]



def test_transforms_run_only_on_the_records_each_batch_needs():
    # A slow transform must delay a batch by that batch's records only, not by a
    # whole chunk: count the calls after each batch, against the per-record stages.
    def calls_per_batch(threads):
        seen = []

        class Count(grainlike.MapTransform):
            def map(self, x):
                seen.append(x)
                return x

        class Odd(grainlike.FilterTransform):
            def filter(self, x):
                return x % 2 == 1

        it = iter(_loader([Count(), Odd(), grainlike.Batch(5)], threads=threads))
        counts = []
        for _ in range(6):
            next(it)
            counts.append(len(seen))
        it.close()
        return counts

    chunked = calls_per_batch(False)
    assert chunked == calls_per_batch(True)  # (reads in threads, transforms in this one)
    assert chunked[0] < 20  # about 10 records for 5 odd ones, not a chunk of 256


def test_a_small_source_is_located_at_most_a_chunk_ahead(monkeypatch):
    # A shuffled sampler builds one permutation per epoch a locate spans: over
    # 20 records, locating 4096 positions ahead built 205 (~1 s per next()).
    from grainlike.core import samplers

    spans = []
    original = samplers.IndexSampler.locate

    def locate(self, indices):
        spans.append(len(indices))
        return original(self, indices)

    monkeypatch.setattr(samplers.IndexSampler, "locate", locate)
    sampler = grainlike.IndexSampler(20, grainlike.NoSharding(), shuffle=True, num_epochs=None, seed=0)
    loader = grainlike.DataLoader(data_source=list(range(20)), sampler=sampler, operations=[grainlike.Batch(4)])
    it = iter(loader)
    batches = [next(it) for _ in range(15)]
    # Every epoch is a permutation of the 20 records, in grain's order.
    assert sorted(np.concatenate(batches[:5]).tolist()) == list(range(20))
    # Never more than a chunk of records (256) at once, however far 20 records
    # of a never-ending sampler go.
    assert spans and max(spans) <= 256


class _DrawAndMaybeKeep(grainlike.RandomMapTransform):
    """Draws from the record's rng; keeps the generators of the records in ``keep``."""

    def __init__(self, keep=()):
        self.keep = set(keep)
        self.kept = {}
        self.seen = set()

    def random_map(self, x, rng):
        self.seen.add(id(rng))
        draw = int(rng.integers(1 << 62))
        if x in self.keep:
            self.kept[x] = (rng, rng.bit_generator.state)
        return {"x": np.int64(x), "draw": np.int64(draw)}


def _draw_loader(transform, seed=5):
    source = grainlike.InMemoryDataSource(list(range(N)))
    sampler = grainlike.IndexSampler(N, grainlike.NoSharding(), shuffle=False, num_epochs=1, seed=seed)
    return grainlike.DataLoader(
        data_source=source, sampler=sampler, operations=[transform, grainlike.Batch(8)], worker_count=0
    )


def test_generators_of_batched_records_are_reused_with_fresh_draws():
    transform = _DrawAndMaybeKeep()
    draws = np.concatenate([b["draw"] for b in _draw_loader(transform)])
    # Each record draws what a generator built for it alone draws: Philox(key=seed + index).
    expected = [np.random.Generator(np.random.Philox(key=5 + i)).integers(1 << 62) for i in range(N)]
    assert draws.tolist() == expected
    # ... from far fewer generators than records.
    assert len(transform.seen) < N // 4


def test_a_generator_a_transform_keeps_is_never_reused():
    keep = {3, 100, 301, 599}
    transform = _DrawAndMaybeKeep(keep)
    list(_draw_loader(transform))
    for x in keep:
        rng, state_then = transform.kept[x]
        # Not reset for a later record: still the record's key, where its draw left it.
        assert rng.bit_generator.state["state"]["key"].tolist() == [5 + x, 0]
        assert rng.bit_generator.state["state"]["counter"].tolist() == state_then["state"]["counter"].tolist()
        assert rng.bit_generator.state["buffer_pos"] == state_then["buffer_pos"]


class _OddAt(grainlike.MapTransform):
    """Records as dicts of numpy values; record 50 differs from the others in one way."""

    def __init__(self, how):
        self.how = how

    def map(self, x):
        out = {"img": np.full((2, 3), x, np.float32), "label": np.int32(x), "zero_d": np.array(x)}
        if x != 50:
            return out
        if self.how == "shape":
            out["img"] = np.zeros((3, 3), np.float32)
        elif self.how == "dtype":
            out["img"] = out["img"].astype(np.float64)
        elif self.how == "scalar_for_0d":
            out["zero_d"] = np.int64(x)
        elif self.how == "python_int":
            out["label"] = int(x)
        elif self.how == "key_order":
            out = {"label": out["label"], "img": out["img"], "zero_d": out["zero_d"]}
        elif self.how == "extra_key":
            out["extra"] = np.int8(1)
        elif self.how == "list_leaf":
            out["img"] = [1, 2]
        return out


@pytest.mark.parametrize(
    "how", ["none", "shape", "dtype", "scalar_for_0d", "python_int", "key_order", "extra_key", "list_leaf"]
)
@pytest.mark.parametrize("batch_size", [7, 64])
def test_batches_copied_record_by_record_equal_stacking_at_the_end(how, batch_size, monkeypatch):
    # Batches of big records are built row by row as records come (tree.Stacker);
    # a record that does not fit the first one's layout, and a short last batch,
    # go back to stacking the whole batch, with the same result or the same error.
    monkeypatch.setattr(batch_lib, "ROW_BYTES", 0)  # These small records count as big.
    ops = lambda: [_OddAt(how), grainlike.Batch(batch_size)]  # noqa: E731
    chunked = _run(_loader(ops(), threads=False, shuffle=False), steps=120)
    per_record = _run(_loader(ops(), threads=True, per_record=True, shuffle=False), steps=120)
    assert chunked == per_record
    errors = [x for x in chunked if isinstance(x, tuple) and x[0] == "error"]
    # Stacking raises where the structure or a shape differs; it promotes dtypes.
    assert bool(errors) == (how in ("shape", "extra_key", "list_leaf"))
    assert all(e[1] == "ValueError" and "cannot stack" in e[2] for e in errors)


def test_big_records_are_copied_into_their_batch_as_they_come(monkeypatch):
    from grainlike.core import tree as tree_lib

    copied = []
    real_add = tree_lib.Stacker.add

    def add(self, elements, start=0, stop=None):
        real_add(self, elements, start, stop)
        copied.append(self.count)

    monkeypatch.setattr(tree_lib.Stacker, "add", add)

    class Big(grainlike.MapTransform):
        def map(self, x):
            return np.full(batch_lib.ROW_BYTES // 8, x, np.int64)

    batches = list(_loader([Big(), grainlike.Batch(4)], threads=False, shuffle=False))
    assert [int(b[0, 0]) for b in batches[:3]] == [0, 4, 8]
    assert copied and max(copied) == 4  # rows copied in, batch after batch


@pytest.mark.parametrize("names", [["square", "batch"], ["square", "filter", "noise", "batch", "batch_noise"]])
def test_positions_skipped_after_an_elastic_restore_match_per_record_stages(names):
    # Positions delivered before a restore on another worker count, inside the
    # first chunk, on a chunk's edge (256) and at the next position itself.
    import json

    from grainlike.loader.legacy_state import SKIP_KEY

    it = iter(_loader(_ops(names), threads=False))
    for _ in range(3):
        next(it)
    state = json.loads(it.get_state())
    at = state["last_seen_indices"]["0"] + 1
    skip = [at, at + 2, at + 3, at + 40, 255, 256, 257, 300]
    state[SKIP_KEY] = skip
    runs = {}
    for threads, per_record in ((False, False), (True, True), (True, False)):
        restored = iter(_loader(_ops(names), threads=threads, per_record=per_record))
        restored.set_state(json.dumps(state).encode())
        runs[threads, per_record] = [json.loads(restored.get_state())] + _run(restored)
    assert runs[False, False] == runs[True, True] == runs[True, False]
    runs[False] = runs[False, False]
    assert SKIP_KEY in runs[False][0]
    assert runs[False][-1] == "stop" and SKIP_KEY not in json.loads(runs[False][-2])
    sampler = grainlike.IndexSampler(N, grainlike.NoSharding(), shuffle=True, num_epochs=1, seed=5)
    skipped_keys = {sampler[g].record_key for g in skip}
    delivered = [x for out in runs[False] if isinstance(out, dict) and "x" in out for x in out["x"][1]]
    assert not skipped_keys & set(delivered)
    assert len(delivered) == len({sampler[g].record_key for g in range(at, N)} - skipped_keys) - (
        sum(1 for g in range(at, N) if g not in skip and sampler[g].record_key % 3 == 0) if "filter" in names else 0
    )


@pytest.mark.parametrize("threads", [False, True])
def test_positions_skipped_after_an_elastic_restore_are_not_read_on_the_chunked_path(threads):
    import json

    from grainlike.loader.legacy_state import SKIP_KEY

    class RecordingSource(PlainSource):
        def __init__(self):
            super().__init__()
            self.reads = []

        def __getitems__(self, keys):
            self.reads.append(list(keys))
            return list(keys)

    it = iter(_loader(_ops(["square", "batch"]), threads=False))
    next(it)
    state = json.loads(it.get_state())
    at = state["last_seen_indices"]["0"] + 1
    skip = list(range(at + 1, at + 600 // 2))  # Whole chunks of 256 positions among them.
    state[SKIP_KEY] = skip
    source = RecordingSource()
    restored = iter(_loader(_ops(["square", "batch"]), threads=threads, source=source))
    restored.set_state(json.dumps(state).encode())
    delivered = [x for batch in restored for x in batch["x"].tolist()]
    sampler = grainlike.IndexSampler(N, grainlike.NoSharding(), shuffle=True, num_epochs=1, seed=5)
    skipped = {sampler[g].record_key for g in skip}
    read = [k for keys in source.reads for k in keys]
    assert all(source.reads) and not skipped & set(read)
    assert sorted(delivered) == sorted(read) == sorted({sampler[g].record_key for g in range(at, N)} - skipped)
