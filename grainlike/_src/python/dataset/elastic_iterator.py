"""``grain._src.python.dataset.elastic_iterator``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import ElasticIterator

__all__ = ['ElasticIterator']
