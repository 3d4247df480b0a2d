from grainlike.experimental import ThreadPrefetchIterDataset
from grainlike.jax.device_put import device_put

__all__ = ["ThreadPrefetchIterDataset", "device_put"]
