"""``grain._src.python.dataset.transformations.process_prefetch``: grain's private path, re-exported from grainlike."""

from grainlike.dataset.process_prefetch import ProcessPrefetchIterDataset, multiprocess_prefetch

__all__ = ['ProcessPrefetchIterDataset', 'multiprocess_prefetch']
