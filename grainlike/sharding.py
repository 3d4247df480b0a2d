"""``grain.sharding``: which part of the data each process loads."""

from grainlike.core.sharding import NoSharding, ShardByJaxProcess, ShardOptions

__all__ = ["NoSharding", "ShardByJaxProcess", "ShardOptions"]
