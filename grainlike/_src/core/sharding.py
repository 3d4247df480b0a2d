from grainlike.sharding import NoSharding, ShardByJaxProcess, ShardOptions
from grainlike.core.sharding import even_split

__all__ = ['NoSharding', 'ShardByJaxProcess', 'ShardOptions', 'even_split']
