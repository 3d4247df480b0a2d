"""Options for reading and for worker processes (defined in the dataset layer)."""

from grainlike.dataset.options import MultiprocessingOptions, ReadOptions

__all__ = ["MultiprocessingOptions", "ReadOptions"]
