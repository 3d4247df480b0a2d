from grainlike.dataset.slice import ReindexMapDataset, SliceMapDataset

__all__ = ['ReindexMapDataset', 'SliceMapDataset']
