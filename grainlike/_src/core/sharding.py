"""``grain._src.core.sharding``: grain's private path, re-exported from grainlike."""

from grainlike.sharding import NoSharding, ShardByJaxProcess, ShardOptions

__all__ = ['NoSharding', 'ShardByJaxProcess', 'ShardOptions']
