"""grain's metrics (``grain.monitoring``), exported to Prometheus when telemetry is on.

``grainlike.monitoring`` is ``grainlike._src.core.monitoring``, which re-exports
grain's names from here, as ``grain.monitoring`` is ``grain._src.core.monitoring``.

The names of ``grain.monitoring``: ``Counter``, ``Metric`` (a gauge) and
``EventMetric`` (a histogram) take a name, ``Metadata`` and ``fields`` (label
names) positionally or by keyword. As in grain, only the five metrics of
``EXPORTED`` reach ``prometheus_client`` (its default registry); any other metric
is accepted and records nothing, and ``Get`` is always 0.0.

``import grainlike`` does not import ``prometheus_client``: it is imported when
telemetry starts, or when an exported metric is first made or recorded. grainlike's
own stages record the five metrics only while ``recording`` is true, the one check
on their paths: it turns true when ``ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY=true`` at
``import grainlike`` (or at a later ``setup_telemetry()``), and ``prometheus_client``
is installed. The main process then serves ``/metrics`` over HTTP on
``PYGRAIN_PROMETHEUS_PORT`` (default 9431; 0 or less: no server), those of the
worker processes included (``PROMETHEUS_MULTIPROC_DIR``). See docs/migrating.md.
"""

from __future__ import annotations

import atexit
import errno
import functools
import logging
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
import types
from typing import Any, Callable, Optional

from grainlike.core import monitoring_base
from grainlike.core.monitoring_base import Bucketer, Metadata, Units
from grainlike.core.tree import estimate_byte_size

__all__ = [
    "Bucketer", "Counter", "EventMetric", "Metadata", "Metric", "Units", "fast_monitoring", "get_monitoring_root",
    "monitoring_base",
    "record_autotune_node_throughput", "record_autotune_optimization_latency", "record_autotune_parameter",
    "record_autotune_usl_coeff", "record_bytes_read_and_latency", "record_framework_type", "set_debug_server_ports",
    "setup_telemetry",
]

_logger = logging.getLogger("grainlike")

DEFAULT_PORT = 9431
ENABLE_VARIABLE = "ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY"
PORT_VARIABLE = "PYGRAIN_PROMETHEUS_PORT"
MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
# The metrics grain exports to Prometheus (grain's names); no other is.
EXPORTED = frozenset({
    "/grain/python/dataset/next_duration_ns",
    "/grain/python/dataset/prefetch_buffer_ready_count",
    "/grain/python/data_sources/bytes_read",
    "/grain/python/dataset/source_read_time_ns",
    "/grain/python/data_loader/iterator_get_next",
})

# Whether grainlike's stages record their metrics: read on every element, so a
# module attribute that stays False unless telemetry is on.
recording = False

_lock = threading.RLock()
_prometheus_objects: dict = {}  # Prometheus name -> its Counter / Gauge / Histogram.
_client: Any = False  # prometheus_client once looked up (None: not installed).
_serving = False
_hooks: list = []


def _prometheus() -> Any:
    """``prometheus_client``, imported on first use; None when it is not installed."""
    global _client
    if _client is False:
        try:
            import prometheus_client
        except ImportError:
            prometheus_client = None
        _client = prometheus_client
    return _client


def get_monitoring_root() -> None:
    """None: Prometheus has no monitoring root (as in grain)."""
    return None


def _metadata_and_fields(metadata: Any, args: tuple, kwargs: dict) -> tuple[Any, list]:
    """The ``Metadata`` and the fields, from keywords or wherever they stand among the positional arguments."""
    found = kwargs.pop("metadata", None)
    fields = kwargs.pop("fields", None)
    for arg in ((metadata,) if metadata is not None else ()) + args:
        if found is None and isinstance(arg, Metadata):
            found = arg
        elif fields is None and isinstance(arg, (list, tuple)):
            fields = arg
    return found, list(fields or [])


class _Exported:
    """A metric; the Prometheus object behind it (``_metric``) exists for the exported names only."""

    _default_description = ""
    _kind = ""  # As the warning on a label mismatch names it.

    def _bind(self, name: str, metadata: Any, fields: list, kind: str, **options: Any) -> None:
        self._metric = None
        client = _prometheus() if name in EXPORTED else None
        if client is None:
            return
        prometheus_name = name.strip("/").replace("/", "_")
        description = self._default_description
        if metadata and hasattr(metadata, "description"):
            description = metadata.description
        with _lock:
            metric = _prometheus_objects.get(prometheus_name)
            if metric is None:
                try:
                    metric = getattr(client, kind)(
                        prometheus_name, description,
                        labelnames=tuple(f[0] for f in fields), **options,
                    )
                except ValueError as e:  # Registered by someone else (grain itself, in the same process).
                    _logger.warning("Cannot export %s to Prometheus: %s", name, e)
                    return
                except OSError as e:  # Its file cannot be written (the program removed the folder at exit).
                    _logger.debug("Cannot export %s to Prometheus: %s", name, e)
                    return
                _prometheus_objects[prometheus_name] = metric
        self._metric = metric

    def _apply(self, method: str, value: Any, args: tuple, kwargs: dict) -> None:
        metric = self._metric
        if metric is None:
            return
        if not args and not kwargs:
            getattr(metric, method)(*value)
            return
        try:
            getattr(metric.labels(*args, **kwargs), method)(*value)
        except ValueError as e:  # A label mismatch is logged, never raised into the pipeline.
            _logger.warning("Failed to record Prometheus %s due to label mismatch: %s.", self._kind, e)

    def Get(self, *args: Any, **kwargs: Any) -> float:  # noqa: N802
        """0.0: Prometheus metrics are not read back (as in grain)."""
        del args, kwargs
        return 0.0

    def ClearAll(self) -> None:  # noqa: N802
        """Does nothing (as in grain)."""


class Counter(_Exported):
    """A counter: ``Counter(name, metadata=None, fields=[(label, type), ...])``."""

    _default_description = "Grain Counter"
    _kind = "event"

    def __init__(self, name: str, metadata: Any = None, *args: Any, **kwargs: Any):
        metadata, fields = _metadata_and_fields(metadata, args, kwargs)
        self._bind(name, metadata, fields, "Counter")

    def Increment(self, *args: Any, **kwargs: Any) -> None:  # noqa: N802
        """Adds one to the count of the labels ``args`` / ``kwargs``."""
        self._apply("inc", (), args, kwargs)

    def IncrementBy(self, value: float, *args: Any, **kwargs: Any) -> None:  # noqa: N802
        """Adds ``value`` to the count of the labels ``args`` / ``kwargs``."""
        self._apply("inc", (value,), args, kwargs)


class Metric(_Exported):
    """A gauge: ``Metric(name, value_type=float, metadata=None, fields=[...])``."""

    _default_description = "Grain Gauge"
    _kind = "gauge"

    def __init__(self, name: str, value_type: type = float, metadata: Any = None, *args: Any, **kwargs: Any):
        del value_type
        metadata, fields = _metadata_and_fields(metadata, args, kwargs)
        self._bind(name, metadata, fields, "Gauge")

    def Set(self, value: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N802
        """Sets the value of the labels ``args`` / ``kwargs``."""
        self._apply("set", (value,), args, kwargs)


# Units -> (first bucket, end of the buckets): an hour in the metric's unit.
_BUCKET_SPANS = {
    Units.SECONDS: (0.001, 3600.0),
    Units.MILLISECONDS: (1.0, 3600000.0),
    None: (1.0, 3600000.0),
    Units.MICROSECONDS: (1.0, 3600000000.0),
    Units.NANOSECONDS: (1.0, 3600000000000.0),
}
_BUCKETS_END = 1e18  # For units that are not times (bits, bytes).


def powers_of_buckets(bucketer: Any, units: Any = None) -> Optional[list]:
    """The upper bounds of a ``Bucketer.PowersOf(base)`` histogram in ``units`` (grain's), or None.

    Example:
      >>> powers_of_buckets(Bucketer.PowersOf(10.0), Units.SECONDS)
      [0.001, 0.01, 0.1, 1.0, 10.0, 100.0, 1000.0]
    """
    if getattr(bucketer, "type", None) != "PowersOf" or not bucketer.args:
        return None
    base = bucketer.args[0]
    if base <= 1.0:
        _logger.warning("Prometheus Bucketer.PowersOf requires base > 1.0, got %f", base)
        return None
    known = units is None or isinstance(units, Units)
    value, end = _BUCKET_SPANS.get(units, (1.0, _BUCKETS_END)) if known else (1.0, _BUCKETS_END)
    end = min(end, _BUCKETS_END)
    buckets = []
    while value < end:  # Multiplied step by step, so the bounds are grain's to the last bit.
        buckets.append(value)
        value *= base
    return buckets


class EventMetric(_Exported):
    """A histogram: ``EventMetric(name, metadata=None, fields=[...], bucketer=Bucketer.PowersOf(b))``.

    ``buckets=[...]`` gives the bounds directly; a ``PowersOf`` bucketer starts at
    1 (0.001 for seconds) and ends before an hour in ``metadata.units``
    (milliseconds when unset).
    """

    _default_description = "Grain Histogram"
    _kind = "histogram"

    def __init__(self, name: str, metadata: Any = None, *args: Any, **kwargs: Any):
        metadata, fields = _metadata_and_fields(metadata, args, kwargs)
        buckets = kwargs.get("buckets")
        bucketer = kwargs.get("bucketer")
        if buckets is None and isinstance(bucketer, Bucketer):
            buckets = powers_of_buckets(bucketer, getattr(metadata, "units", None) if metadata else None)
        self._bind(name, metadata, fields, "Histogram", **({"buckets": buckets} if buckets else {}))

    def Record(self, value: float, *args: Any, **kwargs: Any) -> None:  # noqa: N802
        """Adds ``value`` to the histogram of the labels ``args`` / ``kwargs``."""
        self._apply("observe", (value,), args, kwargs)

    def record_times(self, value: float, times: int, *labels: Any) -> None:
        """``Record(value, *labels)`` ``times`` times, the labels looked up once."""
        if self._metric is None:
            return
        try:
            target = self._metric.labels(*labels) if labels else self._metric
        except ValueError as e:
            _logger.warning("Failed to record Prometheus %s due to label mismatch: %s.", self._kind, e)
            return
        for _ in range(times):
            target.observe(value)


@functools.lru_cache(maxsize=None)
def exported() -> types.SimpleNamespace:
    """grainlike's five exported metrics, made (and ``prometheus_client`` imported) on first use."""
    ns = Units.NANOSECONDS
    return types.SimpleNamespace(
        iterator_get_next=EventMetric(
            "/grain/python/data_loader/iterator_get_next",
            Metadata(description="Gauge for DataLoaderIterator.__next__() latency.", units=ns),
        ),
        next_duration=EventMetric(
            "/grain/python/dataset/next_duration_ns",
            metadata=Metadata(
                description=(
                    "Histogram of durations of every `__next__` call on the output iterator. Each data point is "
                    "the duration value of `__next__` call."
                ),
                units=ns,
            ),
            bucketer=Bucketer.PowersOf(2.0),
        ),
        prefetch_ready=EventMetric(
            "/grain/python/dataset/prefetch_buffer_ready_count",
            metadata=Metadata(
                description=(
                    "Distribution of the number of consecutive elements from the front of the prefetch buffer "
                    "that are ready for consumption. Low values indicate a possible IO bottleneck."
                ),
            ),
        ),
        bytes_read=Counter(
            "/grain/python/data_sources/bytes_read",
            Metadata(description="Number of bytes produced by a data source via random access."),
            fields=[("source", str)],
        ),
        read_time=EventMetric(
            "/grain/python/dataset/source_read_time_ns",
            metadata=Metadata(description="Histogram of source read time in nanoseconds.", units=ns),
            bucketer=Bucketer.PowersOf(4.0),
            fields=[("source", str)],
        ),
    )


# grain's hook for a native recorder of source reads: an object with
# ``record_bytes_read_and_latency(source, num_bytes, latency_ns, num_reads)``, or None.
fast_monitoring: Any = None


def record_bytes_read_and_latency(source: str, *, num_bytes: int, latency_ns: int, num_reads: int) -> None:
    """Records ``num_bytes`` read from ``source`` in ``num_reads`` reads that took ``latency_ns`` in all."""
    if fast_monitoring is not None:
        fast_monitoring.record_bytes_read_and_latency(source, num_bytes, latency_ns, num_reads)
        return
    metrics = exported()
    metrics.bytes_read.IncrementBy(num_bytes, source)
    if num_reads > 0:
        metrics.read_time.record_times(latency_ns / num_reads, num_reads, source)


def record_read(source: Any, values: Any, start_ns: int, num_reads: int) -> None:
    """Records a read of ``num_reads`` records (``values``) from ``source`` begun at ``start_ns``.

    grain's source metrics: the bytes of the records' arrays and strings, and
    the read's time shared among its reads, labelled with the source's class name.
    """
    latency_ns = time.perf_counter_ns() - start_ns
    record_bytes_read_and_latency(
        type(source).__name__, num_bytes=estimate_byte_size(values), latency_ns=latency_ns, num_reads=num_reads,
    )


def record_ready(pending: Any, taken: int, moved: int) -> None:
    """grain's ``prefetch_buffer_ready_count``, once for each of ``moved`` elements leaving a read-ahead.

    ``pending``: the reads in flight in order, ``(size, future, chunk)``, each
    chunk with the ``values`` read so far and ``done``; ``taken``: the first
    chunk's values taken before. Ready in order are the first chunk's values not
    taken and those of the chunks after it while each before is done; the count
    goes down by one with each element taken.
    """
    ready = -taken
    for _, _, chunk in pending:
        ready += len(chunk.values)
        if not chunk.done:
            break
    record = exported().prefetch_ready.Record
    for i in range(moved):
        record(ready - i)


def on_recording(hook: Callable[[], None]) -> None:
    """Calls ``hook()`` when grainlike's stages start recording (at once if they do)."""
    with _lock:
        _hooks.append(hook)
        if not recording:
            return
    hook()


def _start_recording() -> None:
    global recording
    with _lock:
        if recording or _prometheus() is None:
            return
        exported()
        recording = True
        hooks = list(_hooks)
    for hook in hooks:
        hook()


def _port_from_environment() -> int:
    text = os.environ.get(PORT_VARIABLE)
    if not text:
        return DEFAULT_PORT
    try:
        return int(text)
    except ValueError:
        _logger.warning("Invalid %s %r. Falling back to default %d.", PORT_VARIABLE, text, DEFAULT_PORT)
        return DEFAULT_PORT


def initialize(port: Optional[int] = None) -> None:
    """Serves the metrics over HTTP on ``port`` (None: ``PYGRAIN_PROMETHEUS_PORT``, default 9431), once.

    A port of 0 or less starts no server. With ``PROMETHEUS_MULTIPROC_DIR`` set
    before ``prometheus_client`` was imported, the server adds up the metrics of
    every process that writes there (the workers'); otherwise it serves this
    process's default registry.
    """
    global _serving
    client = _prometheus()
    if _serving or client is None:
        return
    if port is None:
        port = _port_from_environment()
    with _lock:
        if _serving:
            return
        if port > 0:
            registry = client.REGISTRY
            if MULTIPROC_VARIABLE in os.environ and getattr(client.values.ValueClass, "_multiprocess", False):
                from prometheus_client import multiprocess

                registry = client.CollectorRegistry()
                multiprocess.MultiProcessCollector(registry)
            try:
                client.start_http_server(port, registry=registry)
                _logger.info("Prometheus metrics server started on port %s.", port)
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    _logger.warning("Failed to start Prometheus server: %s", e)
                    return
                _logger.info("Prometheus server already active.")
        _serving = True


def use_multiprocess_directory() -> None:
    """Points ``PROMETHEUS_MULTIPROC_DIR`` at a new folder, removed at exit, unless it is set."""
    if MULTIPROC_VARIABLE in os.environ:
        return
    folder = tempfile.mkdtemp(prefix="prometheus_multiproc_")
    os.environ[MULTIPROC_VARIABLE] = folder
    creator = os.getpid()

    def remove() -> None:
        if os.getpid() == creator:  # Not in a forked child that exits first.
            shutil.rmtree(folder, ignore_errors=True)

    atexit.register(remove)


def setup_telemetry(*, serve: Optional[bool] = None) -> None:
    """Starts telemetry when ``ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY`` is ``true`` (any case); else does nothing.

    grainlike's stages start recording their metrics, and the main process (or
    the one ``serve`` names) serves them (``initialize``). ``import grainlike``
    calls it.
    """
    if os.environ.get(ENABLE_VARIABLE, "false").lower() != "true":
        return
    # Before prometheus_client is imported: it picks per-process files then.
    use_multiprocess_directory()
    if _prometheus() is None:
        _logger.warning("prometheus-client not found. Grain metrics will not be reported to Prometheus.")
        return
    if serve is None:
        serve = multiprocessing.current_process().name == "MainProcess" and multiprocessing.parent_process() is None
    if serve:
        initialize()
    _start_recording()


# Metrics of grain's that are not exported: recorded into nothing, as in grain.
_framework_type = Counter(
    "/grain/framework_type",
    Metadata(description="The framework type used to build the Grain dataset."),
    fields=[("name", str)],
)
_debug_server_ports = Metric(
    "/grain/debug_server_ports", str, metadata=Metadata(description="A comma-separated list of debug server ports."),
)
_autotune_node_throughput = Metric("/grain/autotune/node_throughput", float, fields=[("node_name", str)])
_autotune_parameters = Metric("/grain/autotune/parameters", float, fields=[("node_name", str), ("name", str)])
_autotune_usl_coeffs = Metric("/grain/autotune/usl_coeffs", float, fields=[("node_name", str), ("name", str)])
_autotune_optimization_latency = EventMetric("/grain/autotune/optimization_latency")


def record_framework_type(framework_type: str) -> None:
    """Counts a pipeline built with ``framework_type`` (not exported)."""
    _framework_type.Increment(framework_type)


def set_debug_server_ports(ports: list) -> None:
    """Sets the debug servers' ports (not exported); an empty list changes nothing."""
    if ports:
        _debug_server_ports.Set(",".join(map(str, ports)))


def record_autotune_node_throughput(node_name: str, throughput: float) -> None:
    """Records an autotuned node's throughput (not exported)."""
    _autotune_node_throughput.Set(throughput, node_name)


def record_autotune_parameter(node_name: str, name: str, value: float) -> None:
    """Records an autotuned parameter's value (not exported)."""
    _autotune_parameters.Set(value, node_name, name)


def record_autotune_usl_coeff(node_name: str, name: str, value: float) -> None:
    """Records an autotuned node's USL coefficient (not exported)."""
    _autotune_usl_coeffs.Set(value, node_name, name)


def record_autotune_optimization_latency(latency_ms: float) -> None:
    """Records the autotune optimizer's time (not exported)."""
    _autotune_optimization_latency.Record(latency_ms)
