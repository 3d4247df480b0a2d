from grainlike.constants import DATASET_INDEX, EPOCH, INDEX, RECORD, RECORD_KEY, SEED

__all__ = ['DATASET_INDEX', 'EPOCH', 'INDEX', 'RECORD', 'RECORD_KEY', 'SEED']
