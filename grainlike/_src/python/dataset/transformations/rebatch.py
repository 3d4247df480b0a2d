from grainlike.dataset.transformations.rebatch import RebatchIterDataset

__all__ = ['RebatchIterDataset']
