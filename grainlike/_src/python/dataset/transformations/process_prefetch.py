from grainlike.core.config import config
from grainlike.dataset.parallel.process_prefetch import ProcessPrefetchIterDataset, multiprocess_prefetch

__all__ = ['ProcessPrefetchIterDataset', 'config', 'multiprocess_prefetch']
