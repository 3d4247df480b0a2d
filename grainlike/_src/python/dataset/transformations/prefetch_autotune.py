"""``grain._src.python.dataset.transformations.prefetch_autotune``: grain's private path, re-exported from grainlike."""

from grainlike.dataset.performance import PerformanceConfig, pick_performance_config

__all__ = ['PerformanceConfig', 'pick_performance_config']
