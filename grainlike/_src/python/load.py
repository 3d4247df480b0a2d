from grainlike import load

__all__ = ['load']
