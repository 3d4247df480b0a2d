"""``grain.samplers``: which record each step reads, and with which rng.

``IndexSampler``, ``SequentialSampler`` and the ``Sampler`` protocol are grain's;
``RandomSampler`` and ``PaddedEpochSampler`` are grainlike's. ``BaseSampler``,
``SampledIndices``, ``BatchPadding`` and ``as_sampler`` are grainlike's sampler
contract: a sampler derived from ``BaseSampler`` locates many global indices in
one call.
"""

from grainlike.core.samplers import (
    BaseSampler,
    BatchPadding,
    IndexSampler,
    SampledIndices,
    Sampler,
    SequentialSampler,
    as_sampler,
)
from grainlike.core.sampling import PaddedEpochSampler, RandomSampler

# Every name imported above.
__all__ = sorted(name for name in dir() if not name.startswith("_"))
