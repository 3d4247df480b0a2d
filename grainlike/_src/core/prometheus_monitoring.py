from grainlike.core.monitoring import (
    Bucketer,
    Counter,
    EventMetric,
    Metadata,
    Metric,
    Units,
    get_monitoring_root,
    record_bytes_read_and_latency,
)
from grainlike.core.monitoring import initialize as Initialize
from grainlike.core.monitoring import record_bytes_read_and_latency as RecordBytesReadAndLatency
from grainlike.core.monitoring import setup_telemetry as SetupTelemetry

__all__ = ['Bucketer', 'Counter', 'EventMetric', 'Initialize', 'Metadata', 'Metric', 'RecordBytesReadAndLatency',
           'SetupTelemetry', 'Units', 'get_monitoring_root', 'record_bytes_read_and_latency']
