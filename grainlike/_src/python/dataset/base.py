"""``grain._src.python.dataset.base``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import DatasetOptions, ExecutionTrackingMode
from grainlike.sources import RandomAccessDataSource

__all__ = ['DatasetOptions', 'ExecutionTrackingMode', 'RandomAccessDataSource']
