from grainlike.dataset.parallel.performance import PerformanceConfig, pick_performance_config

__all__ = ['PerformanceConfig', 'pick_performance_config']
