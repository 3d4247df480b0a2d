"""``grain._src.python.data_sources``: grain's private path, re-exported from grainlike."""

from grainlike.sources import ArrayRecordDataSource, RangeDataSource, SharedMemoryDataSource

__all__ = ['ArrayRecordDataSource', 'RangeDataSource', 'SharedMemoryDataSource']
