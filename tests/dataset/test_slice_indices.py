"""``MapDataset.slice`` with a sequence of indices (grain's main branch, after 0.2.18).

grain 0.2.18's ``slice`` takes a ``slice`` only; grain's main branch also takes a
``Sequence[int]`` or a ``MapDataset[int]`` (``ReindexMapDataset``). The expected
values marked "grain main" are transcribed from the test of that name in grain's
main branch, ``grain/_src/python/dataset/transformations/slice_test.py``
(``ReindexMapDatasetTest``) or ``dataset_test.py``; the others follow from its
rule, element ``i`` is ``parent[indices[i % n] + (i // n) * len(parent)]``. The
differential tests against grain 0.2.18's parents are in
tests/compat/test_slice_indices_compat.py.
"""

import pickle

import numpy as np
import pytest

from grainlike.dataset import MapDataset
from grainlike.dataset.conformance import assert_equal_output_after_checkpoint
from grainlike.dataset.nodes.element_spec import get_element_spec
from grainlike.dataset.nodes.options import MultiprocessingOptions
from grainlike.dataset.transformations.slice import ReindexMapDataset, SliceMapDataset

pytestmark = pytest.mark.timeout(120)


# grain main: ReindexMapDatasetTest.test_reindex (parent MapDataset.range(10)).
@pytest.mark.parametrize(
    "indices",
    [[3, 1, 4, 1, 5], [0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [0, 0, 0, 0], [7], [0, 1, 2], [9, 8, 7], [5]],
)
def test_elements_are_the_parents_at_the_indices(indices):
    ds = MapDataset.range(10).slice(indices)
    assert isinstance(ds, ReindexMapDataset)
    assert len(ds) == len(indices)
    assert list(ds) == indices


def test_slice_with_indices():
    # grain main: DatasetTest.test_slice_with_indices.
    ds = MapDataset.range(10).slice([3, 1, 4, 1, 5])
    assert len(ds) == 5
    assert list(ds) == [3, 1, 4, 1, 5]


def test_indices_may_be_a_map_dataset():
    # grain main: test_reindex_with_map_dataset_indices(_sliced),
    # test_via_map_dataset_slice_with_map_dataset.
    ds = MapDataset.range(10).slice(MapDataset.range(5))
    assert isinstance(ds, ReindexMapDataset)
    assert len(ds) == 5 and list(ds) == [0, 1, 2, 3, 4]
    ds = MapDataset.range(20).slice(MapDataset.range(10)[::2])
    assert len(ds) == 5 and list(ds) == [0, 2, 4, 6, 8]
    ds = MapDataset.range(10).slice(MapDataset.range(3))
    assert list(ds) == [0, 1, 2]


def test_a_slice_object_still_gives_a_slice_dataset():
    # grain main: test_via_map_dataset_slice_with_slice_unchanged.
    ds = MapDataset.range(10).slice(slice(2, 5))
    assert isinstance(ds, SliceMapDataset)
    assert list(ds) == [2, 3, 4]


def test_indices_past_the_end_read_the_parents_next_epoch():
    # grain main: test_multi_epoch_access, test_multi_epoch_with_map_with_index.
    ds = MapDataset.range(10).slice([3, 7])
    assert len(ds) == 2
    assert [ds[i] for i in range(4)] == [3, 7, 3, 7]
    ds = MapDataset.range(10).map_with_index(lambda i, x: {"index": i, "value": x}).slice([2, 5])
    assert [ds[i] for i in range(4)] == [
        {"index": 2, "value": 2},
        {"index": 5, "value": 5},
        {"index": 12, "value": 2},
        {"index": 15, "value": 5},
    ]


def test_getitems_reads_a_chunk():
    # grain main: test_getitems, test_getitems_multi_epoch.
    ds = MapDataset.range(10).slice([3, 1, 4, 1, 5])
    assert list(ds._getitems([0, 2, 4])) == [3, 4, 5]
    assert list(MapDataset.range(10).slice([3, 7])._getitems([0, 1, 2, 3])) == [3, 7, 3, 7]


def test_getitems_with_map_dataset_indices_equals_getitem():
    parent = MapDataset.range(10).map_with_index(lambda i, x: (i, x))
    ds = parent.slice(MapDataset.range(9, -1, -3))  # indices 9, 6, 3, 0
    positions = [0, 5, 2, 11, 3, 4]
    assert list(ds._getitems(positions)) == [ds[i] for i in positions]
    assert ds[5] == (16, 6)


def test_slicing_a_reindexed_dataset_gives_a_slice_dataset():
    # grain main: test_slice_on_reindexed_dataset.
    ds = MapDataset.range(10).slice([3, 1, 4, 1, 5])
    sliced = ds[1:4]
    assert isinstance(sliced, SliceMapDataset)
    assert list(sliced) == [1, 4, 1]


def test_iter():
    # grain main: test_iter.
    assert list(iter(MapDataset.range(10).slice([9, 0, 5]))) == [9, 0, 5]


def test_empty_indices_give_an_empty_dataset():
    # grain main: test_empty_indices.
    ds = MapDataset.range(10).slice([])
    assert len(ds) == 0
    assert list(ds) == []


@pytest.mark.parametrize(
    "indices, expected",
    [
        # grain main: test_str_short_indices, test_str_long_indices (parent range(100)).
        ([1, 2, 3], "ReindexMapDataset(indices=[1, 2, 3], len=3)"),
        (list(range(10)), "ReindexMapDataset(indices=[0, 1, ..., 8, 9], len=10)"),
        # Up to five indices are shown as str() shows the sequence, more as their
        # first two and last two.
        ((4, 5), "ReindexMapDataset(indices=(4, 5), len=2)"),
        (np.array([1, 2, 3]), "ReindexMapDataset(indices=[1 2 3], len=3)"),
        (np.arange(6), "ReindexMapDataset(indices=[0, 1, ..., 4, 5], len=6)"),
        (range(7), "ReindexMapDataset(indices=[0, 1, ..., 5, 6], len=7)"),
        (MapDataset.range(3), "ReindexMapDataset(indices=RangeMapDataset(start=0, stop=3, step=1), len=3)"),
        (MapDataset.range(10)[::2], "ReindexMapDataset(indices=SliceMapDataset[0:10:2], len=5)"),
        (MapDataset.range(20)[::2], "ReindexMapDataset(indices=[0, 2, ..., 16, 18], len=10)"),
    ],
)
def test_str_shows_the_indices_and_length(indices, expected):
    assert str(MapDataset.range(100).slice(indices)) == expected


def test_element_spec_is_the_parents():
    # grain main: test_element_spec.
    spec = get_element_spec(MapDataset.range(10).slice([1, 2, 3]))
    assert spec.dtype == np.int64
    assert spec.shape == ()


def test_numpy_indices_reach_the_parent_unchanged():
    # Index i of epoch e reads parent[indices[i] + e * len(parent)]: a numpy int
    # index stays one, and range's element computed from it is a numpy int.
    ds = MapDataset.range(10).slice(np.array([9, 0, 5]))
    out = list(ds)
    assert out == [9, 0, 5]
    assert all(type(x) is np.int64 for x in out)
    assert [type(x) for x in MapDataset.range(10).slice([9, 0])] == [int, int]


def test_out_of_range_and_negative_indices_are_passed_to_the_parent():
    # Nothing is checked when built (as grain main): the parent gets the index,
    # and range and sources take it modulo their length.
    assert list(MapDataset.range(10).slice([15, -1, 10])) == [5, 9, 0]
    assert list(MapDataset.source(["a", "b", "c"]).slice([4, -3])) == ["b", "a"]
    ds = MapDataset.range(10).map_with_index(lambda i, x: (i, x)).slice([15, -1])
    assert list(ds) == [(15, 5), (-1, 9)]


def test_indices_that_are_not_ints_fail_when_read():
    ds = MapDataset.range(10).slice(["a", "b"])  # built without a check, as grain main
    assert len(ds) == 2
    with pytest.raises(TypeError, match="can only concatenate str"):
        ds[0]
    with pytest.raises(TypeError, match="can only concatenate str"):
        list(ds)


def test_indices_without_a_length_are_refused_at_once_as_in_grain_0_2_18():
    # grain main builds a ReindexMapDataset over 5 and fails at len(); grain 0.2.18
    # refuses it when built: grainlike keeps 0.2.18's error.
    with pytest.raises(ValueError, match="sl is not a slice: <class 'int'>"):
        MapDataset.range(10).slice(5)


def test_slice_map_dataset_still_refuses_other_types():
    # grain main: SliceMapDatasetTest.test_init_raises_error_for_non_slice_object.
    with pytest.raises(ValueError, match="sl is not a slice: <class 'int'>"):
        SliceMapDataset(MapDataset.range(10), 5)


def test_a_shuffle_above_sees_later_epochs():
    parent = MapDataset.range(6).shuffle(seed=3)
    ds = parent.slice([0, 1, 2, 3, 4, 5])
    assert [ds[i] for i in range(12)] == [parent[i] for i in range(12)]
    assert sorted(ds[i] for i in range(6, 12)) == list(range(6))


def test_pickles():
    ds = MapDataset.range(10).map(lambda x: x * 2).slice(MapDataset.range(10)[::3])
    import cloudpickle

    copy = pickle.loads(cloudpickle.dumps(ds))
    assert list(copy) == list(ds) == [0, 6, 12, 18]


@pytest.mark.parametrize(
    "make",
    [
        lambda: MapDataset.range(10).slice([3, 1, 4, 1, 5]).to_iter_dataset(),
        lambda: MapDataset.range(10).shuffle(seed=1).slice([9, 0, 5, 5]).repeat(3).to_iter_dataset(),
        lambda: MapDataset.range(20).slice(MapDataset.range(20)[::3]).map(lambda x: x + 1).to_iter_dataset().batch(2),
        lambda: MapDataset.range(10).random_map(lambda x, rng: x + rng.integers(100), seed=2)
        .slice([7, 7, 2]).repeat(2).to_iter_dataset(),
        lambda: MapDataset.range(10).slice([8, 2, 8, 3, 1]).filter(lambda x: x != 8).to_iter_dataset(),
    ],
    ids=["list", "shuffle-repeat", "map-dataset-indices-batch", "random-map-repeat", "filter"],
)
def test_restores_at_every_step(make):
    assert_equal_output_after_checkpoint(make())


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_read_the_same_elements(workers, no_leaks):
    ds = MapDataset.range(30).map(lambda x: x * 10).slice(MapDataset.range(30)[::-4])
    expected = [x * 10 for x in range(29, -1, -4)]
    it = ds.to_iter_dataset().mp_prefetch(MultiprocessingOptions(num_workers=workers))
    assert sorted(it) == sorted(expected)
    assert_equal_output_after_checkpoint(
        MapDataset.range(12).slice([11, 0, 5, 5, 3]).to_iter_dataset().mp_prefetch(
            MultiprocessingOptions(num_workers=workers)
        )
    )


def test_reads_wait_only_where_the_parent_or_the_index_pipeline_waits():
    from grainlike.dataset.transformations.read_threads import pipeline_waits

    assert not pipeline_waits(MapDataset.range(10).slice([1, 2]))
    assert not pipeline_waits(MapDataset.range(10).slice(MapDataset.range(3).shuffle(seed=0)))
    assert pipeline_waits(MapDataset.range(10).map(lambda x: x).slice([1, 2]))
    assert pipeline_waits(MapDataset.range(10).slice(MapDataset.range(3).map(lambda x: x)))
