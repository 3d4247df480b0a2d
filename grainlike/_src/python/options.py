from grainlike import MultiprocessingOptions, ReadOptions

__all__ = ['MultiprocessingOptions', 'ReadOptions']
