from grainlike.dataset.transformations.filter import FilterIterDataset, FilterMapDataset, FilterThresholdChecker

__all__ = ['FilterIterDataset', 'FilterMapDataset', 'FilterThresholdChecker']
