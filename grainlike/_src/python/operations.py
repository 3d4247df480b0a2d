"""``grain._src.python.operations``: grain's private path, re-exported from grainlike."""

from grainlike.core.operations import BatchOperation, FilterOperation, MapOperation, RandomMapOperation

__all__ = ['BatchOperation', 'FilterOperation', 'MapOperation', 'RandomMapOperation']
