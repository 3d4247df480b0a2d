"""``grain._src.python.experimental.example_packing.packing``: grain's private path, re-exported from grainlike."""

from grainlike.core.pack_and_batch import PackAndBatchOperation

__all__ = ['PackAndBatchOperation']
