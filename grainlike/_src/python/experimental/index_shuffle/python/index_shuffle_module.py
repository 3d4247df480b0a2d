from grainlike.experimental import index_shuffle

__all__ = ['index_shuffle']
