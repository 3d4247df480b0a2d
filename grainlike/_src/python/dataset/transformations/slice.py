from grainlike.dataset.slice import SliceMapDataset

__all__ = ['SliceMapDataset']
