"""The stage protocol of grainlike's Dataset API: reads, errors, states, close, str."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from grainlike.core.errors import InvalidStateError, StateIndexError, StateKeyError, StateTypeError
from grainlike.core.transforms import FilterTransform, MapTransform
from grainlike.dataset import IterDataset, MapDataset
from grainlike.dataset.nodes.options import ReadOptions
from tests.helpers.leaks import LeakCheck


class CountingSource:
    """A source that records its batched reads."""

    def __init__(self, n):
        self.n = n
        self.batched_calls = []
        self.single_calls = 0

    def __len__(self):
        return self.n

    def __getitem__(self, key):
        self.single_calls += 1
        return key * 10

    def __getitems__(self, keys):
        self.batched_calls.append(list(keys))
        return [k * 10 for k in keys]


def test_iteration_reads_the_source_in_chunks():
    source = CountingSource(300)
    assert list(MapDataset.source(source).map(lambda x: x + 1)) == [k * 10 + 1 for k in range(300)]
    assert source.single_calls == 0
    sizes = [len(c) for c in source.batched_calls]
    assert sum(sizes) == 300
    assert len(sizes) < 60  # chunks (of up to 8 with read threads), not one call per record
    assert sizes[0] == 1  # the first element is not delayed by a big read


def test_shuffled_slice_reads_keys_in_batches():
    source = CountingSource(100)
    ds = MapDataset.source(source)[1::2].map(lambda x: x)
    assert list(ds) == [k * 10 for k in range(1, 100, 2)]
    assert [k for c in source.batched_calls for k in c] == list(range(1, 100, 2))


@pytest.mark.parametrize("threads", [0, 3])
def test_error_in_a_chunk_delivers_the_elements_before_it(threads):
    def boom(x):
        if x == 37:
            raise KeyError("bad record")
        return x

    options = ReadOptions(num_threads=threads, prefetch_buffer_size=16)
    it = iter(MapDataset.range(60).map(boom).to_iter_dataset(options))
    got = [next(it) for _ in range(37)]
    assert got == list(range(37))
    with pytest.raises(KeyError) as info:
        next(it)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "boom" in notes and "index 37" in notes
    assert it.get_state() == {"next_index": 37}
    it.close()


def test_error_note_names_the_transform_class_and_index():
    class Explode(MapTransform):
        def map(self, x):
            raise ZeroDivisionError(x)

    ds = MapDataset.range(5)[2:].map(Explode())
    with pytest.raises(ZeroDivisionError) as info:
        ds[1]
    notes = "\n".join(info.value.__notes__)
    assert "Explode" in notes and "index 1" in notes and "MapMapDataset" in notes


def test_iterator_error_note_names_the_transform_and_state():
    def fail_on_three(x):
        if x == 3:
            raise RuntimeError("three")
        return x

    it = iter(MapDataset.range(5).to_iter_dataset().map(fail_on_three))
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(RuntimeError) as info:
        next(it)
    notes = "\n".join(info.value.__notes__)
    assert "fail_on_three" in notes and "{'next_index': 4}" in notes


def test_batch_error_names_the_batch():
    ds = MapDataset.source([np.zeros(2), np.zeros(3)]).batch(2)
    with pytest.raises(ValueError) as info:
        ds[0]
    assert "BatchMapDataset(batch_size=2" in "\n".join(info.value.__notes__)


@pytest.mark.parametrize(
    "state, error",
    [
        ({}, StateKeyError),
        ([3], StateTypeError),
        ({"next_index": -1}, StateIndexError),
        ({"next_index": "2"}, StateTypeError),
        ({"next_index": 11}, StateIndexError),
    ],
)
def test_bad_state_is_rejected_and_changes_nothing(state, error):
    it = iter(MapDataset.range(10).to_iter_dataset())
    next(it)
    with pytest.raises(error) as info:
        it.set_state(state)
    assert "PrefetchDatasetIterator" in str(info.value)
    assert it.get_state() == {"next_index": 1}
    assert next(it) == 1


def test_state_errors_are_grain_types():
    assert issubclass(StateKeyError, KeyError) and issubclass(StateKeyError, ValueError)
    assert issubclass(StateIndexError, IndexError) and issubclass(StateIndexError, ValueError)
    assert issubclass(StateTypeError, TypeError) and issubclass(StateTypeError, ValueError)
    assert str(StateKeyError("lacks 'x'")) == "lacks 'x'"


def test_nested_state_validation_keeps_the_parent_unchanged():
    it = iter(MapDataset.range(10).to_iter_dataset().map_with_index(lambda i, x: x))
    next(it)
    before = it.get_state()
    with pytest.raises(InvalidStateError):
        it.set_state({"parent": {"next_index": 5}, "counter": -2})
    assert it.get_state() == before


def test_threads_give_the_same_order_and_stop_on_close():
    leaks = LeakCheck()
    ds = MapDataset.source(list(range(200))).map(lambda x: x * 3)
    expected = [x * 3 for x in range(200)]
    threaded = ds.to_iter_dataset(ReadOptions(num_threads=4, prefetch_buffer_size=20))
    assert list(threaded) == expected
    it = iter(threaded)
    it.start_prefetch()
    assert next(it) == 0
    it.close()
    it.close()  # idempotent
    with pytest.raises(ValueError, match="closed iterator"):
        next(it)
    del it
    leaks.assert_clean()


def test_close_closes_the_parents():
    it = iter(MapDataset.range(4).to_iter_dataset().map(str).batch(2))
    prefetch = it._parent._parent
    it.close()
    assert prefetch._closed
    with pytest.raises(ValueError):
        next(it)


def test_str_names_each_stage():
    ds = MapDataset.range(3).map(str)[1:].batch(2)
    assert str(ds) == "BatchMapDataset(batch_size=2, drop_remainder=False)"
    assert str(ds.parents[0]) == "SliceMapDataset[1:3:1]"
    assert str(ds.parents[0].parents[0]) == "MapMapDataset(transform=str)"
    assert str(MapDataset.range(3).filter(bool)) == "FilterMapDataset(transform=bool)"
    it = iter(MapDataset.source([1]).to_iter_dataset().map(str))
    assert str(it).startswith("MapDatasetIterator(transform=str")
    assert "PrefetchDatasetIterator(read_options=ReadOptions(" in str(it._parent)


def test_user_defined_datasets_plug_in():
    class Squares(MapDataset):
        def __init__(self, parent):
            super().__init__(parent)

        def __len__(self):
            return len(self._parent)

        def __getitem__(self, index):
            return self._parent[index] ** 2

    assert list(Squares(MapDataset.range(4)).map(lambda x: -x)) == [0, -1, -4, -9]

    class Counter(IterDataset):
        def __iter__(self):
            return iter(MapDataset.range(3).to_iter_dataset())

    assert list(Counter().map(lambda x: x + 1)) == [1, 2, 3]


def test_pipe_and_parents():
    ds = MapDataset.range(5)
    piped = ds.pipe(lambda d, k: d.map(lambda x: x * k), 3)
    assert list(piped) == [0, 3, 6, 9, 12]
    assert piped.parents == (ds,)


def test_non_callable_transform_is_a_type_error():
    with pytest.raises(TypeError, match=r"map takes a Map(Transform)? or a callable, got 42"):
        MapDataset.range(3).map(42)


def test_str_of_random_and_mixing_stages():
    r = MapDataset.range
    assert str(r(3).shuffle(seed=1)) == "ShuffleMapDataset"
    assert str(r(3).repeat(2)) == "RepeatMapDataset(num_epochs=2)"
    assert str(r(3).seed(1)) == "WithOptionsMapDataset"
    assert str(r(3).to_iter_dataset().seed(1)) == "WithOptionsIterDataset"
    assert str(MapDataset.mix([r(3), r(4)])) == "MixedMapDataset[2 parents]"
    assert repr(MapDataset.mix([r(3), r(4)], [1, 2])) == (
        "MixedMapDataset(parent_lengths=[3, 4], selection_map="
        "SelectionWithProportionsMap(proportions=(100, 200), length=6))"
    )
    mixed = IterDataset.mix([r(2).to_iter_dataset(), r(2).to_iter_dataset()], [1, 3])
    assert str(mixed) == "MixedIterDataset([2 parents], proportions=[100, 300])"
    assert str(iter(mixed)) == "MixedDatasetIterator([2 parents], proportions=(100, 300))"
    text = str(r(3).random_map(lambda x, rng: x, seed=1))
    assert text.startswith("RandomMapMapDataset(transform=") and "<lambda>" in text and "test_stages.py:" in text


def test_mix_reads_each_source_in_batches_and_close_reaches_every_parent():
    a, b = CountingSource(40), CountingSource(40)
    ds = MapDataset.mix([MapDataset.source(a).shuffle(seed=1), MapDataset.source(b)], [1, 3])
    assert len(list(ds)) == 53
    assert a.single_calls == b.single_calls == 0
    assert len(a.batched_calls) < 10 and len(b.batched_calls) < 10
    it = iter(IterDataset.mix([MapDataset.range(3).to_iter_dataset(), MapDataset.range(3).to_iter_dataset()]))
    next(it)
    it.close()
    assert all(p._closed for p in it._parents)


def test_mix_error_names_the_component_and_stops():
    def fail(x):
        raise OSError("unreadable")

    it = iter(IterDataset.mix({"good": MapDataset.range(5).to_iter_dataset(), "bad": MapDataset.range(5).to_iter_dataset().map(fail)}))
    with pytest.raises(OSError) as info:
        next(it)  # "bad" sorts first, as in grain
    assert "reading dataset 'bad'" in "\n".join(info.value.__notes__)
    with pytest.raises(StopIteration):
        next(it)
    assert it.get_state()["stop"] is True


def test_mix_bad_state_leaves_every_component_as_it_was():
    it = iter(IterDataset.mix([MapDataset.range(5).to_iter_dataset(), MapDataset.range(5).to_iter_dataset()]))
    next(it)
    before = it.get_state()
    with pytest.raises(InvalidStateError):
        it.set_state({"parents": [{"next_index": 3}, {"next_index": 9}], "index": 4, "stop": False})
    assert it.get_state() == before
    with pytest.raises(InvalidStateError):
        it.set_state({"parents": [{"next_index": 3}], "index": 4, "stop": False})
    assert it.get_state() == before


def test_batch_allocator_receives_every_stacked_leaf():
    shapes = []

    def alloc(shape, dtype):
        shapes.append((shape, np.dtype(dtype)))
        return np.empty(shape, dtype)

    ds = MapDataset.source([{"a": np.ones(3, np.float32) * i, "b": np.int64(i)} for i in range(4)]).to_iter_dataset().batch(2)
    ds.set_allocator(alloc)
    batches = list(ds)
    assert batches[1]["a"].tolist() == [[2, 2, 2], [3, 3, 3]]
    assert ((2, 3), np.dtype(np.float32)) in shapes


def test_mp_prefetch_without_workers_is_the_dataset_itself():
    from grainlike.dataset.nodes.options import MultiprocessingOptions

    ds = MapDataset.range(3).to_iter_dataset()
    assert ds.mp_prefetch(MultiprocessingOptions(num_workers=0)) is ds
    with pytest.warns(DeprecationWarning):
        assert ds.prefetch(MultiprocessingOptions(num_workers=0)) is ds


def test_random_map_builds_generators_only_for_present_elements():
    seen = []
    ds = MapDataset.range(10).filter(lambda x: x % 5 == 0).random_map(lambda x, rng: seen.append(x) or x, seed=3)
    assert list(ds) == [0, 5]
    assert seen == [0, 5]
    # The pool reuses generators instead of building one per element.
    assert len(ds._pool._free) == 1


def test_set_slice_reads_a_workers_share_in_place():
    ds = MapDataset.range(20).shuffle(seed=2).map(lambda x: x * 10).to_iter_dataset()
    whole = list(ds)
    ds.set_slice(slice(1, None, 3))
    assert list(ds) == whole[1::3]


def test_thread_prefetch_close_does_not_wait_for_a_slow_element_and_leaves_no_thread():
    import threading
    import time

    from grainlike.dataset.transformations.thread_prefetch import ThreadPrefetchIterDataset

    leaks = LeakCheck()
    release = threading.Event()

    def slow(x):
        if x == 2:
            release.wait(10)
        return x

    it = iter(ThreadPrefetchIterDataset(MapDataset.range(5).to_iter_dataset().map(slow), prefetch_buffer_size=4))
    assert [next(it), next(it)] == [0, 1]
    assert it.get_state() == {"next_index": 2}
    start = time.monotonic()
    it.close()
    # Waiting for the thread's read of element 2 would take the 10 s of its wait.
    assert time.monotonic() - start < 5.0
    with pytest.raises(ValueError, match="closed iterator"):
        next(it)
    with pytest.raises(ValueError):
        it.start_prefetch()
    release.set()
    leaks.assert_clean()


def test_thread_prefetch_restores_and_reports_next_index():
    from grainlike.dataset import get_next_index, set_next_index
    from grainlike.dataset.transformations.thread_prefetch import ThreadPrefetchIterDataset

    ds = ThreadPrefetchIterDataset(MapDataset.range(10).to_iter_dataset().map(lambda x: -x), prefetch_buffer_size=3)
    it = iter(ds)
    next(it)
    set_next_index(it, 6)
    assert get_next_index(it) == 6 and next(it) == -6
    state = it.get_state()
    it.set_state({"next_index": 2})
    assert get_next_index(it) == 2 and next(it) == -2
    it.set_state(state)
    assert list(it) == [-7, -8, -9]
    it.close()


def test_heavy_filtering_logs_a_warning_naming_the_stage(caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="grainlike"):
        assert len(list(MapDataset.range(2000).to_iter_dataset().filter(lambda x: x % 20 == 0))) == 100
    assert any("FilterDatasetIterator" in r.getMessage() and "95.00 %" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="grainlike"):
        assert len(list(MapDataset.range(2000).filter(lambda x: x % 20 == 0))) == 100
    assert any("PrefetchDatasetIterator" in r.getMessage() for r in caplog.records)


def test_options_reach_stages_on_both_sides_and_the_last_wins():
    from grainlike.dataset.nodes.options import DatasetOptions
    from grainlike.dataset.transformations.seed import WithOptionsIterDataset

    ds = MapDataset.range(2000).to_iter_dataset()
    ds = WithOptionsIterDataset(ds, DatasetOptions(filter_raise_threshold_ratio=0.5))
    ds = ds.filter(lambda x: x % 10 == 0)
    assert len(list(WithOptionsIterDataset(ds, DatasetOptions(filter_raise_threshold_ratio=0.95)))) == 200
    with pytest.raises(ValueError, match="skipped 90.00 %"):
        list(WithOptionsIterDataset(ds, DatasetOptions(filter_warn_threshold_ratio=None)))


class _DropAll(FilterTransform):
    def __repr__(self) -> str:  # grain names a Filter by its class, not its repr
        return "_DropAll(everything)"

    def filter(self, x):
        return False


def test_a_filter_dropping_too_many_is_named_as_grain_then_where_it_is_defined():
    from grainlike.dataset.nodes.options import DatasetOptions
    from grainlike.dataset.transformations.seed import WithOptionsIterDataset

    ds = MapDataset.range(1000).to_iter_dataset().filter(_DropAll())
    assert str(ds) == "FilterIterDataset(transform=_DropAll)"
    ds = WithOptionsIterDataset(ds, DatasetOptions(filter_raise_threshold_ratio=0.999))
    with pytest.raises(ValueError) as raised:
        list(ds)
    message = str(raised.value)
    assert message.startswith(
        "Transformation FilterDatasetIterator(transform=_DropAll) skipped 100.00 % of the last seen 1000 elements."
        " The transform is _DropAll (" + __file__
    ), message


def test_the_threshold_checker_takes_grains_arguments_a_name_and_two_ratios(caplog):
    from grainlike.dataset.transformations.filter import WINDOW, FilterThresholdChecker

    checker = FilterThresholdChecker("my_filter", 0.5, None)
    with caplog.at_level(logging.WARNING, logger="grainlike"):
        for i in range(WINDOW):
            checker.check(i % 4 == 0)
    assert "Transformation my_filter skipped 75.00 % of the last seen 1000 elements." in caplog.text
    checker = FilterThresholdChecker("my_filter", None, 0.5)
    for i in range(WINDOW - 1):
        checker.check(i % 2 == 0)  # 499 of 999 dropped: no full window yet
    with pytest.raises(ValueError, match=r"^Transformation my_filter skipped 50.00 % of the last seen 1000 elements\."):
        checker.check(False)


def test_merging_iterator_contexts_of_different_worker_processes_raises_naming_both():
    from grainlike.dataset.base import IteratorContext, MultiprocessingContext

    ctx = IteratorContext()
    other = IteratorContext(mp_context=MultiprocessingContext(process_index=1, process_count=2))
    with pytest.raises(ValueError) as raised:
        ctx.merge(other)
    assert str(raised.value) == (
        "Cannot merge contexts from different worker processes: MultiprocessingContext(process_index=0, "
        "process_count=1) vs MultiprocessingContext(process_index=1, process_count=2)."
    )


def test_every_iterator_stage_satisfies_the_declared_stage_protocol():
    from grainlike.core.protocols import DatasetIteratorProtocol, Prefetching
    from grainlike.dataset.nodes.dataset_node import walk
    from grainlike.experimental import ThreadPrefetchIterDataset

    shuffled = MapDataset.range(12).shuffle(seed=1).filter(lambda x: x % 5)
    ds = IterDataset.mix([shuffled.to_iter_dataset(), MapDataset.range(3).repeat(2).to_iter_dataset()])
    ds = ThreadPrefetchIterDataset(ds.map(lambda x: x * 2).batch(2), prefetch_buffer_size=2)
    it = iter(ds)
    stages = list(walk(it))
    assert len(stages) >= 6
    for stage in stages:
        assert isinstance(stage, DatasetIteratorProtocol), stage
        assert isinstance(stage, Prefetching), stage
    it.close()


def test_checkpointable_is_decided_by_the_methods_alone():
    from grainlike.core.protocols import Checkpointable, Closeable, missing_state_methods

    class Position:
        def get_state(self):
            return {"i": 0}

        def set_state(self, state):
            pass

    class ReadOnly:
        def get_state(self):
            return {"i": 0}

    assert isinstance(Position(), Checkpointable) and not isinstance(Position(), Closeable)
    assert not isinstance(ReadOnly(), Checkpointable)
    assert missing_state_methods(Position()) == ""
    assert missing_state_methods(ReadOnly()) == "set_state()"
    assert missing_state_methods(iter([1])) == "get_state()/set_state()"


def test_walk_visits_each_stage_once_and_a_stage_without_super_init_has_no_parents():
    from grainlike.dataset.nodes.dataset_node import parents, walk

    class NoInit(IterDataset):
        def __init__(self):  # skips super().__init__, as user datasets may
            pass

        def __iter__(self):
            return iter(MapDataset.range(2).to_iter_dataset())

    shared = MapDataset.range(4)
    ds = MapDataset.mix([shared.map(str), shared])
    assert [type(s).__name__ for s in walk(ds)] == ["MixedMapDataset", "MapMapDataset", "RangeMapDataset"]
    assert parents(NoInit()) == ()
    assert [type(s).__name__ for s in walk(NoInit().map(str))] == ["MapIterDataset", "NoInit"]


def test_an_iterator_of_another_class_is_one_parent_and_is_not_read():
    from grainlike.dataset.nodes.iterator import DatasetIterator, IteratorContext

    class Forever:  # an infinite iterator of another class (as a copy of the class in a worker)
        _ctx = IteratorContext()

        def __iter__(self):
            return self

        def __next__(self):
            return 1

    class Above(DatasetIterator):
        def __next__(self):
            return next(self._parents[0]) + 1

        def get_state(self):
            return {}

        def set_state(self, state):
            pass

    source = Forever()
    it = Above(source)
    assert it._parents == (source,) and next(it) == 2
