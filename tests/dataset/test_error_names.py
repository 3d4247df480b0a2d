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
