"""``grain.samplers``: which record each step reads, and with which rng.

``IndexSampler``, ``SequentialSampler`` and the ``Sampler`` protocol are grain's;
``RandomSampler`` and ``PaddedEpochSampler`` are grainlike's.
"""

from grainlike.core.samplers import IndexSampler, Sampler, SequentialSampler
from grainlike.core.sampling import PaddedEpochSampler, RandomSampler

__all__ = ["IndexSampler", "PaddedEpochSampler", "RandomSampler", "Sampler", "SequentialSampler"]
