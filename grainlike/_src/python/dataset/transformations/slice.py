from grainlike.dataset.transformations.slice import ReindexMapDataset, SliceMapDataset

__all__ = ['ReindexMapDataset', 'SliceMapDataset']
