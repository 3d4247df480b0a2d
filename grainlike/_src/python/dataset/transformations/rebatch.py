from grainlike.dataset.rebatch import RebatchIterDataset

__all__ = ['RebatchIterDataset']
