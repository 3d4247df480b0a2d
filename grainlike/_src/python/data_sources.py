from grainlike.sources import ArrayRecordDataSource, RangeDataSource, SharedMemoryDataSource

__all__ = ['ArrayRecordDataSource', 'RangeDataSource', 'SharedMemoryDataSource']
