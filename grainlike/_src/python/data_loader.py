from grainlike import DataLoader, DataLoaderIterator

__all__ = ['DataLoader', 'DataLoaderIterator']
