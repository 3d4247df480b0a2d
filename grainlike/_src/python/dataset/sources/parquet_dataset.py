from grainlike.experimental import ParquetIterDataset

__all__ = ['ParquetIterDataset']
