from grainlike.dataset.sources.source import RangeMapDataset, SourceMapDataset

__all__ = ['RangeMapDataset', 'SourceMapDataset']
