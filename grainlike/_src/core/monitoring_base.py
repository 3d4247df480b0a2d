from grainlike.core.monitoring_base import (
    Bucketer,
    CounterProtocol,
    EventMetricProtocol,
    Metadata,
    MetricProtocol,
    Units,
)

__all__ = ['Bucketer', 'CounterProtocol', 'EventMetricProtocol', 'Metadata', 'MetricProtocol', 'Units']
