"""``grain._src.python.dataset.sources.parquet_dataset``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import ParquetIterDataset

__all__ = ['ParquetIterDataset']
