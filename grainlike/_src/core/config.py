"""``grain._src.core.config``: grain's private path, re-exported from grainlike."""

from grainlike.core.config import config

__all__ = ['config']
