from grainlike import DataLoader, DataLoaderIterator
from grainlike.loader.data_loader import _determine_worker_count

__all__ = ['DataLoader', 'DataLoaderIterator', '_determine_worker_count']
