"""``grain._src.python.dataset.transformations.filter``: grain's private path, re-exported from grainlike."""

from grainlike.dataset.filter import FilterIterDataset, FilterMapDataset, FilterThresholdChecker

__all__ = ['FilterIterDataset', 'FilterMapDataset', 'FilterThresholdChecker']
