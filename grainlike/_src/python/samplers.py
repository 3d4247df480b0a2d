"""``grain._src.python.samplers``: grain's private path, re-exported from grainlike."""

from grainlike.samplers import IndexSampler, Sampler, SequentialSampler

__all__ = ['IndexSampler', 'Sampler', 'SequentialSampler']
