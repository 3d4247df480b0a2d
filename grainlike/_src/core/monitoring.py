# As grain's module, whose ``from __future__ import annotations`` makes ``grain.monitoring.annotations`` a path.
from __future__ import annotations

from grainlike.core import monitoring_base
from grainlike.core.monitoring import (
    Bucketer,
    Counter,
    EventMetric,
    Metadata,
    Metric,
    Units,
    fast_monitoring,
    get_monitoring_root,
    record_autotune_node_throughput,
    record_autotune_optimization_latency,
    record_autotune_parameter,
    record_autotune_usl_coeff,
    record_bytes_read_and_latency,
    record_framework_type,
    set_debug_server_ports,
    setup_telemetry,
)

__all__ = ['Bucketer', 'Counter', 'EventMetric', 'Metadata', 'Metric', 'Units', 'fast_monitoring', 'get_monitoring_root',
           'monitoring_base', 'record_autotune_node_throughput', 'record_autotune_optimization_latency',
           'record_autotune_parameter', 'record_autotune_usl_coeff', 'record_bytes_read_and_latency',
           'record_framework_type', 'set_debug_server_ports', 'setup_telemetry']
