from grainlike.core.config import config

__all__ = ['config']
