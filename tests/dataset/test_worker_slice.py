"""Slicing a worker's copy of a pipeline in place, sequential slices included.

Expected values follow grain 0.2.18's rule: with ``sequential_slice=True`` worker
``w`` of ``W`` reads ``even_split(len(source), shard w of W)`` of each source (the
first ``len % W`` workers one record more); the differential tests against grain
are in tests/compat/test_mp_prefetch_compat.py and
tests/compat/test_multithread_prefetch_compat.py.
"""

import pytest

from grainlike.core.errors import InvalidStateError, NonSequentialSliceError
from grainlike.dataset import MapDataset
from grainlike.dataset.nodes.options import MultiprocessingOptions
from grainlike.dataset.sources.source import RangeMapDataset, SourceMapDataset
from grainlike.dataset.nodes.worker_slice import SupportsInPlaceSlicing, copy_stages, set_slice

pytestmark = pytest.mark.timeout(120)


class _BatchedSource:
    """A source with a batched read that records the keys it was asked for."""

    def __init__(self, n):
        self.n = n
        self.batches = []

    def __len__(self):
        return self.n

    def __getitem__(self, key):
        return key * 10

    def __getitems__(self, keys):
        self.batches.append(list(keys))
        return [k * 10 for k in keys]


@pytest.mark.parametrize("worker, expected", [(0, range(0, 4)), (1, range(4, 7)), (2, range(7, 10))])
def test_a_source_keeps_a_workers_contiguous_range(worker, expected):
    src = _BatchedSource(10)
    ds = SourceMapDataset(src)
    ds.set_slice(slice(worker, None, 3), sequential_slice=True)
    assert len(ds) == len(expected)
    assert [ds[i] for i in range(len(ds))] == [k * 10 for k in expected]
    # Batched reads ask the source for the range's keys, wrapping around it.
    assert ds._getitems([0, len(ds)]) == [expected[0] * 10, expected[0] * 10]
    assert src.batches[-1] == [expected[0], expected[0]]


def test_a_range_keeps_a_workers_contiguous_part_and_names_it():
    ds = RangeMapDataset(2, 41, 3)  # 13 numbers: parts of 5, 4, 4
    ds.set_slice(slice(1, None, 3), sequential_slice=True)
    assert list(ds) == [17, 20, 23, 26]
    assert str(ds) == "RangeMapDataset(start=17, stop=29, step=3)"  # grain's start and stop


def test_a_second_sequential_slice_replaces_the_first():
    for ds in (SourceMapDataset(list(range(12))), RangeMapDataset(12)):
        ds.set_slice(slice(0, None, 2), sequential_slice=True)
        ds.set_slice(slice(1, None, 4), sequential_slice=True)
        assert list(ds) == [3, 4, 5]


def test_more_workers_than_records_leave_some_workers_nothing():
    ranges = []
    for worker in range(4):
        ds = RangeMapDataset(2)
        ds.set_slice(slice(worker, None, 4), sequential_slice=True)
        ranges.append(list(ds.to_iter_dataset()))
    assert ranges == [[0], [1], [], []]


@pytest.mark.parametrize("ds", [SourceMapDataset([0, 1, 2]), RangeMapDataset(3)], ids=["source", "range"])
def test_a_non_sequential_slice_of_a_source_raises_an_assertion_error_that_names_it(ds):
    with pytest.raises(NonSequentialSliceError, match="Only sequential slicing is supported") as info:
        ds.set_slice(slice(0, 1, 1), sequential_slice=False)
    assert isinstance(info.value, AssertionError)  # grain asserts
    assert isinstance(info.value, ValueError)
    assert str(ds) in str(info.value) and "to_iter_dataset()" in str(info.value)
    assert list(ds) == [0, 1, 2]  # unchanged


@pytest.mark.parametrize("sl", [slice(3, None, 3), slice(-1, None, 3), slice(0, 5, 2), slice(None, None, 2)])
def test_a_sequential_slice_must_be_one_workers(sl):
    for ds in (SourceMapDataset([1, 2, 3]), RangeMapDataset(3)):
        with pytest.raises(ValueError, match=r"slice\(worker_index, None, worker_count\)"):
            ds.set_slice(sl, sequential_slice=True)
        assert len(ds) == 3


def test_a_source_of_unknown_length_cannot_be_sliced_sequentially():
    class Unsized:
        def __len__(self):
            return None

        def __getitem__(self, key):
            return key

    ds = SourceMapDataset(Unsized())
    with pytest.raises(ValueError, match="needs the source's length"):
        ds.set_slice(slice(0, None, 2), sequential_slice=True)


def test_sequential_set_slice_goes_up_to_every_source_of_a_worker_copy_only():
    left, right = MapDataset.range(6), MapDataset.source([f"r{i}" for i in range(4)])
    ds = MapDataset.mix([left, right]).map(lambda x: x).to_iter_dataset()
    assert isinstance(ds, SupportsInPlaceSlicing)
    copy = copy_stages(ds, sequential_slice=True)
    set_slice(copy, slice(1, None, 2), sequential_slice=True)
    # Both sources keep worker 1's half; the mix kept the length it was built
    # with (as in grain) and cycles over the halves.
    assert list(copy)[:4] == [3, "r2", 4, "r3"]
    assert list(ds)[:4] == [0, "r0", 1, "r1"]  # the dataset built is whole


def test_a_source_without_set_slice_cannot_be_sliced_sequentially():
    class Source(MapDataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return index

    ds = copy_stages(Source().to_iter_dataset(), sequential_slice=True)
    with pytest.raises(ValueError, match="Cannot slice `MapDataset` source.*MapDataset.source"):
        set_slice(ds, slice(0, None, 2), sequential_slice=True)


def test_to_iter_dataset_slices_its_sources_when_sequential():
    ds = MapDataset.range(20).shuffle(seed=2).map(lambda x: x * 10).to_iter_dataset()
    ds.set_slice(slice(1, None, 3), sequential_slice=True)
    # Worker 1 of 3 reads records 7..13, shuffled among themselves.
    assert sorted(ds) == [x * 10 for x in range(7, 14)]


@pytest.mark.parametrize("warm_start", [False, True])
def test_mp_prefetch_sequential_workers_read_contiguous_ranges_in_turn(no_leaks, warm_start):
    ds = MapDataset.range(10).to_iter_dataset()
    options = MultiprocessingOptions(num_workers=3, warm_start=warm_start)
    it = iter(ds.mp_prefetch(options, sequential_slice=True))
    assert [next(it) for _ in range(4)] == [0, 4, 7, 1]
    state = it.get_state()
    assert state["iterators_in_use_states"] == [{"next_index": 2}, {"next_index": 1}, {"next_index": 1}]
    assert list(it) == [5, 8, 2, 6, 9, 3]
    it.close()
    assert list(ds) == list(range(10))  # the workers sliced copies
    restored = iter(ds.mp_prefetch(options, sequential_slice=True))
    restored.set_state(state)
    assert list(restored) == [5, 8, 2, 6, 9, 3]
    restored.close()


def test_a_sequential_state_restores_only_on_the_same_number_of_workers(no_leaks):
    ds = MapDataset.range(10).to_iter_dataset()
    it = iter(ds.mp_prefetch(MultiprocessingOptions(num_workers=3), sequential_slice=True))
    next(it)
    state = it.get_state()
    it.close()
    other = iter(ds.mp_prefetch(MultiprocessingOptions(num_workers=2), sequential_slice=True))
    with pytest.raises(InvalidStateError, match="of 3 workers on 2 with sequential_slice=True"):
        other.set_state(state)
    assert list(other) == [0, 5, 1, 6, 2, 7, 3, 8, 4, 9]  # unchanged by the refused state
    other.close()
