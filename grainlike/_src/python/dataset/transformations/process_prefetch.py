from grainlike.dataset.process_prefetch import ProcessPrefetchIterDataset, multiprocess_prefetch

__all__ = ['ProcessPrefetchIterDataset', 'multiprocess_prefetch']
