"""Errors of the Dataset API keep grain's message and name the offending value."""

import pytest

import grainlike as grain
from grainlike.dataset import MapDataset


class Jitter(grain.RandomMapTransform):
    def random_map(self, x, rng):
        return x


def test_a_shuffle_without_seed_names_the_dataset_it_shuffles():
    with pytest.raises(ValueError, match=r"`shuffle` requires a seed.*RangeMapDataset\(start=0, stop=3"):
        MapDataset.range(3).shuffle()


@pytest.mark.parametrize("iterable", [False, True])
def test_a_random_map_without_seed_names_its_transform(iterable):
    ds = MapDataset.range(3)
    if iterable:
        ds = ds.to_iter_dataset()
    with pytest.raises(ValueError, match=r"`random_map` requires a seed.*Jitter"):
        ds.random_map(Jitter())


def test_a_zero_mixing_weight_is_shown_with_the_weights():
    with pytest.raises(ValueError, match=r"non-zero proportions for mixing\. Got \[1, 0\]"):
        MapDataset.mix([MapDataset.range(3), MapDataset.range(3)], [1, 0])


class _MakeGenerator(grain.MapTransform):
    def map(self, x):
        return (i for i in range(x))  # a generator cannot travel back from a worker


def test_an_unpicklable_worker_output_names_the_transform_with_its_file_and_line():
    ds = grain.MapDataset.range(4).to_iter_dataset().map(_MakeGenerator())
    it = iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
    try:
        with pytest.raises(Exception) as info:
            next(it)
    finally:
        it.close()
    text = str(info.value) + "".join(getattr(info.value, "__notes__", []))
    assert "_MakeGenerator (" in text and "test_error_names.py:" in text, text
