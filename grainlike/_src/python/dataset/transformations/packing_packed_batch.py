"""``grain._src.python.dataset.transformations.packing_packed_batch``: grain's private path, re-exported from grainlike."""

from grainlike.dataset.packing import get_non_sequence_meta_features

__all__ = ['get_non_sequence_meta_features']
