from grainlike.experimental import ElasticIterator

__all__ = ['ElasticIterator']
