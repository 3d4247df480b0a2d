from grainlike.samplers import IndexSampler, Sampler, SequentialSampler

__all__ = ['IndexSampler', 'Sampler', 'SequentialSampler']
