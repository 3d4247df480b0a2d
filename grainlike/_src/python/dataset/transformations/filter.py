from grainlike.dataset.filter import FilterIterDataset, FilterMapDataset, FilterThresholdChecker

__all__ = ['FilterIterDataset', 'FilterMapDataset', 'FilterThresholdChecker']
