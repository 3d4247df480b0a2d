from grainlike.experimental import ZipIterDataset, ZipMapDataset

__all__ = ['ZipIterDataset', 'ZipMapDataset']
