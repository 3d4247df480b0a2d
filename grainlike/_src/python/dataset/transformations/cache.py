from grainlike.dataset.cache import CacheIterDataset

__all__ = ['CacheIterDataset']
