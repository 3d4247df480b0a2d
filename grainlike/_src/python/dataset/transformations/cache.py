from grainlike.dataset.transformations.cache import CacheIterDataset

__all__ = ['CacheIterDataset']
