from grainlike.dataset.source import RangeMapDataset, SourceMapDataset

__all__ = ['RangeMapDataset', 'SourceMapDataset']
