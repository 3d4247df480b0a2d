"""``grainlike.monitoring`` against grain 0.2.18's ``grain.monitoring`` and its Prometheus export.

Everything that touches Prometheus runs in fresh processes, one for grain and one
for grainlike: each library registers its metrics in ``prometheus_client``'s
default registry, which one process cannot hold twice, and telemetry, once on,
stays on in its process.
"""

from __future__ import annotations

import inspect
import json
import os
import pathlib
import socket
import subprocess
import sys
import types

import pytest

from grainlike.core import monitoring as ours

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXPORTED = sorted(ours.EXPORTED)


def _kind(value) -> str:
    if isinstance(value, types.ModuleType):
        return "module"
    if inspect.isclass(value):
        return "class"
    return "callable" if callable(value) else type(value).__name__


def _public(module) -> dict:
    return {n: _kind(v) for n, v in vars(module).items() if not n.startswith("_") and n != "annotations"}


@pytest.fixture(scope="module")
def theirs(grain_ref):
    del grain_ref
    import grain

    return grain.monitoring


def test_names_and_kinds_are_grains(theirs):
    import grainlike

    # grain.monitoring is grain._src.core.monitoring; grainlike.monitoring is its alias.
    assert grainlike.monitoring is grainlike._src.core.monitoring
    assert grainlike.monitoring.Counter is ours.Counter and grainlike.monitoring.monitoring_base is ours.monitoring_base
    mine = _public(grainlike.monitoring)
    assert {n: mine.get(n) for n in _public(theirs)} == _public(theirs)
    base = _public(ours.monitoring_base)
    assert {n: base.get(n) for n in _public(theirs.monitoring_base)} == _public(theirs.monitoring_base)
    assert [(u.name, u.value) for u in ours.Units] == [(u.name, u.value) for u in theirs.Units]
    for name in ("Counter", "Metric", "EventMetric"):
        methods = {m for m in dir(getattr(theirs, name)) if not m.startswith("_")}
        assert methods <= set(dir(getattr(ours, name))), name


def _metric_calls(m) -> list:
    """What each call on metrics that are not exported returns (or raises), with every argument form."""
    md = m.Metadata(description="d", units=m.Units.BYTES)
    made = [
        m.Counter("/x/counter"),
        m.Counter("/x/counter", md),
        m.Counter("/x/counter", md, [("a", str)]),
        m.Counter("/x/counter", metadata=md, fields=[("a", str), ("b", int)]),
        m.Counter("/x/counter", [("a", str)], md),
        m.Metric("/x/gauge"),
        m.Metric("/x/gauge", str, md, (("a", str),)),
        m.Metric("/x/gauge", float, metadata=md, fields=[("a", str)]),
        m.EventMetric("/x/histogram"),
        m.EventMetric("/x/histogram", md, bucketer=m.Bucketer.PowersOf(2.0)),
        m.EventMetric("/x/histogram", metadata=md, fields=[("a", str)], buckets=[1.0, 2.0]),
    ]
    out = []
    for metric in made:
        for name, args in [("Increment", ()), ("Increment", ("v",)), ("IncrementBy", (3,)), ("IncrementBy", (3, "v")),
                           ("Set", (1.5,)), ("Set", (1.5, "v", 2)), ("Record", (7,)), ("Record", (7, "v")),
                           ("Get", ()), ("Get", ("v",)), ("ClearAll", ())]:
            if hasattr(metric, name):
                result = getattr(metric, name)(*args)
                out.append((type(metric).__name__, name, args, result, type(result).__name__))
        out.append(getattr(metric, "_metric"))
    out += [m.get_monitoring_root(), m.record_framework_type("jax"), m.set_debug_server_ports([]),
            m.set_debug_server_ports([1, 2]), m.record_autotune_node_throughput("n", 1.0),
            m.record_autotune_parameter("n", "p", 2.0), m.record_autotune_usl_coeff("n", "c", 3.0),
            m.record_autotune_optimization_latency(4.0)]
    return out


def test_metrics_that_are_not_exported_behave_as_grains(theirs):
    assert _metric_calls(ours) == _metric_calls(theirs)


def test_metadata_and_bucketer_are_grains(theirs):
    for m in (ours, theirs):
        md = m.Metadata(description="x", units=m.Units.SECONDS, extra=3)
        assert (md.description, md.units.name, md.extra, md._kwargs) == ("x", "SECONDS", 3, {"units": md.units, "extra": 3})
        b = m.Bucketer.PowersOf(4.0)
        assert (b.args, b.kwargs, b.type) == ((4.0,), {}, "PowersOf")
        b = m.Bucketer(1, 2, bucketer_type="Linear", width=3)
        assert (b.args, b.kwargs, b.type) == ((1, 2), {"width": 3}, "Linear")
        assert m.Metadata().description == ""


@pytest.mark.parametrize("base", [1.5, 2.0, 4.0, 10.0, 1.0, 0.5])
def test_powers_of_buckets_are_grains_for_every_unit(theirs, base):
    from grain._src.core import prometheus_monitoring

    grains = prometheus_monitoring.EventMetric._GetPrometheusBuckets  # (self unused)
    for unit in [None, *theirs.Units]:
        mine = ours.powers_of_buckets(ours.Bucketer.PowersOf(base), None if unit is None else ours.Units[unit.name])
        assert mine == grains(None, theirs.Bucketer.PowersOf(base), units=unit), (base, unit)
    assert ours.powers_of_buckets(ours.Bucketer(2.0)) is None


def _run(code: str, *, env: dict | None = None, timeout: float = 300) -> str:
    """Runs ``code`` in a fresh interpreter (grain's absl flags parsed first) and returns its stdout."""
    prelude = "import absl.flags\nabsl.flags.FLAGS.mark_as_parsed()\n"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("ENABLE_PYGRAIN", "PYGRAIN_", "PROMETHEUS"))}
    full_env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), **(env or {}))
    proc = subprocess.Popen([sys.executable, "-c", prelude + code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env=full_env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert proc.returncode == 0, err[-4000:]
    return out


# Records through each kind of exported metric, with and without labels, and
# prints the calls' outcomes, the warnings logged and the exported samples.
_ROUTING = r"""
import json, logging, sys
import prometheus_client
lib = sys.argv[1] if len(sys.argv) > 1 else LIB
if lib == "grain":
    import grain
    from grain._src.core import prometheus_monitoring as impl
    impl._PROMETHEUS_ALLOWED_METRICS = impl._PROMETHEUS_ALLOWED_METRICS | {"/grain/test/gauge", "/grain/test/labelled"}
    m = grain.monitoring
else:
    import grainlike
    from grainlike.core import monitoring as core
    core.EXPORTED = core.EXPORTED | {"/grain/test/gauge", "/grain/test/labelled"}
    m = grainlike.monitoring
logs = []
class Keep(logging.Handler):
    def emit(self, record):
        logs.append((record.levelname, record.getMessage()))
logging.getLogger().addHandler(Keep())
ns = m.Units.NANOSECONDS
made = {
    "get_next": m.EventMetric("/grain/python/data_loader/iterator_get_next",
                              m.Metadata(description="Gauge for DataLoaderIterator.__next__() latency.", units=ns)),
    "next": m.EventMetric("/grain/python/dataset/next_duration_ns", metadata=m.Metadata(description="n", units=ns),
                          bucketer=m.Bucketer.PowersOf(2.0)),
    "ready": m.EventMetric("/grain/python/dataset/prefetch_buffer_ready_count", metadata=m.Metadata(description="r")),
    "bytes": m.Counter("/grain/python/data_sources/bytes_read", m.Metadata(description="b"), fields=[("source", str)]),
    "gauge": m.Metric("/grain/test/gauge", metadata=m.Metadata(description="My gauge")),
    "labelled": m.Metric("/grain/test/labelled", float, m.Metadata(description="L"), [("a", str), ("b", int)]),
}
calls = [
    ("get_next", "Record", (5,), {}), ("get_next", "Record", (7, "x"), {}),
    ("next", "Record", (1000,), {}), ("ready", "Record", (3,), {}),
    ("bytes", "IncrementBy", (100, "src"), {}), ("bytes", "Increment", ("src",), {}),
    ("bytes", "IncrementBy", (5,), {"source": "kw"}), ("bytes", "Increment", ("a", "b"), {}),
    ("bytes", "Increment", (), {}), ("bytes", "Get", ("src",), {}),
    ("gauge", "Set", (5,), {}), ("gauge", "Set", (6, "x"), {}), ("gauge", "Get", (), {}),
    ("labelled", "Set", (1.5, "u", 2), {}), ("labelled", "Set", (2.5,), {"a": "v", "b": 3}),
    ("labelled", "Set", (1.0, "only-one"), {}),
]
outcomes = []
for key, method, args, kwargs in calls:
    try:
        outcomes.append([key, method, repr(getattr(made[key], method)(*args, **kwargs))])
    except Exception as e:
        outcomes.append([key, method, type(e).__name__])
m.record_bytes_read_and_latency("source_baz", num_bytes=1000, latency_ns=8000, num_reads=2)
samples = sorted(
    [s.name, sorted(s.labels.items()), s.value]
    for family in prometheus_client.REGISTRY.collect() if family.name.startswith("grain_")
    for s in family.samples if not s.name.endswith("_created")
)
print(json.dumps({"outcomes": outcomes, "logs": logs, "samples": samples}))
"""


def test_exported_metrics_record_as_grains_in_prometheus():
    results = {lib: json.loads(_run(_ROUTING.replace("LIB", repr(lib))).splitlines()[-1]) for lib in ("grain", "grainlike")}
    theirs, mine = results["grain"], results["grainlike"]
    assert mine["outcomes"] == theirs["outcomes"]
    assert mine["logs"] == theirs["logs"] and len(theirs["logs"]) == 4
    # grain also registers its fifth metric (source_read_time_ns) when it is imported;
    # record_bytes_read_and_latency makes grainlike's, with the same buckets.
    assert mine["samples"] == theirs["samples"]
    names = {s[0] for s in mine["samples"]}
    assert {"grain_test_gauge", "grain_python_data_sources_bytes_read_total",
            "grain_python_dataset_source_read_time_ns_bucket"} <= names


# Iterates a DataLoader and a Dataset pipeline, reading arrays (so that bytes
# count), then prints the exported samples and the metric families.
_PIPELINES = r"""
import json, sys
import numpy as np
import prometheus_client
lib = LIB
if lib == "grain":
    import grain
else:
    import grainlike as grain
source = [np.zeros(4, np.float32) for _ in range(12)]
loader = grain.DataLoader(
    data_source=source, sampler=grain.samplers.IndexSampler(12, grain.sharding.NoSharding(), shuffle=False, num_epochs=1),
    operations=[grain.transforms.Batch(4)], worker_count=0)
assert len(list(loader)) == 3
ds = grain.MapDataset.source(source).map(lambda x: x + 1).to_iter_dataset(grain.ReadOptions(num_threads=2)).batch(3)
assert len(list(ds)) == 4
families = sorted([f.name, f.type] for f in prometheus_client.REGISTRY.collect() if f.name.startswith("grain_"))
samples = sorted(
    [s.name, sorted(s.labels.items()), s.value]
    for f in prometheus_client.REGISTRY.collect() if f.name.startswith("grain_")
    for s in f.samples if not s.name.endswith("_created")
)
print(json.dumps({"families": families, "samples": samples}))
"""


def test_pipelines_export_grains_metric_names_and_labels():
    theirs = json.loads(_run(_PIPELINES.replace("LIB", '"grain"')).splitlines()[-1])
    # grain records whenever prometheus_client is installed; grainlike when telemetry is on.
    mine = json.loads(_run(_PIPELINES.replace("LIB", '"grainlike"'), env={
        "ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY": "true", "PYGRAIN_PROMETHEUS_PORT": "0"}).splitlines()[-1])
    assert mine["families"] == theirs["families"]
    assert [f for f, _ in mine["families"]] == sorted(
        name.strip("/").replace("/", "_") for name in EXPORTED)

    def by_name(result):
        return {(name, tuple(tuple(label) for label in labels)): value for name, labels, value in result["samples"]}

    assert by_name(mine).keys() == by_name(theirs).keys()
    # Each of the 24 records read once, 16 bytes each.
    expected = {("grain_python_data_sources_bytes_read_total", (("source", "list"),)): 24 * 16,
                ("grain_python_dataset_source_read_time_ns_count", (("source", "list"),)): 24}
    for key, value in expected.items():
        assert by_name(mine)[key] == by_name(theirs)[key] == value, key
    counts = {name: value for (name, _), value in by_name(mine).items() if name.endswith("_count")}
    assert counts["grain_python_data_loader_iterator_get_next_count"] == 4  # 3 batches and the end, as grain
    assert counts["grain_python_dataset_next_duration_ns_count"] == 3 + 4  # the output iterators' batches
    assert counts["grain_python_dataset_prefetch_buffer_ready_count_count"] == 12  # each element read ahead


def test_import_grainlike_imports_no_prometheus_client_unless_telemetry_is_on():
    code = (
        "import sys, grainlike, grainlike.python\n"
        "from grainlike.dataset.nodes.iterator import DatasetIterator\n"
        "from grainlike.dataset.sources.source import SourceMapDataset, _untimed_getitem\n"
        "ds = grainlike.MapDataset.source(list(range(5))).to_iter_dataset().batch(2)\n"
        "assert len(list(ds)) == 3\n"
        "it = iter(ds)\n"
        "print('prometheus_client' in sys.modules, grainlike.core.monitoring.recording,\n"
        "      hasattr(type(it).__next__, '_grainlike_timed'), SourceMapDataset.__getitem__ is _untimed_getitem)\n"
    )
    assert _run(code).split() == ["False", "False", "False", "True"]
    on = _run(code, env={"ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY": "TRUE", "PYGRAIN_PROMETHEUS_PORT": "0"})
    assert on.split() == ["True", "True", "True", "False"]


def test_setup_telemetry_later_times_the_stages_already_loaded():
    code = r"""
import os, prometheus_client, grainlike
ds = grainlike.MapDataset.range(10).to_iter_dataset().map(lambda x: x).batch(4)
assert len(list(ds)) == 3
grainlike.monitoring.setup_telemetry()  # Not enabled: nothing happens.
assert not grainlike.core.monitoring.recording
os.environ.update(ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY="true", PYGRAIN_PROMETHEUS_PORT="0")
grainlike.monitoring.setup_telemetry()
assert len(list(ds)) == 3
print(prometheus_client.REGISTRY.get_sample_value("grain_python_dataset_next_duration_ns_count"))
"""
    assert _run(code).split() == ["3.0"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(600)
def test_environment_variable_serves_metrics_of_the_program_and_its_workers():
    code = r"""
import os, urllib.request
import grainlike as grain
for workers in (0, 2):
    loader = grain.DataLoader(
        data_source=list(range(20)),
        sampler=grain.samplers.IndexSampler(20, grain.sharding.NoSharding(), shuffle=False, num_epochs=1),
        operations=[grain.transforms.Batch(5)], worker_count=workers)
    assert len(list(loader)) == 4
url = "http://127.0.0.1:%s/metrics" % os.environ["PYGRAIN_PROMETHEUS_PORT"]
print(urllib.request.urlopen(url, timeout=30).read().decode())
"""
    out = _run(code, env={"ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY": "true", "PYGRAIN_PROMETHEUS_PORT": str(_free_port())})
    values = {}
    for line in out.splitlines():
        if line.startswith("grain_"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    # Both loaders' next() in this process: 4 batches and the end, twice.
    assert values["grain_python_data_loader_iterator_get_next_count"] == 10
    # The records were read here (no workers) and in the two workers: 20 each time.
    assert values['grain_python_dataset_source_read_time_ns_count{source="list"}'] == 40
    assert values['grain_python_data_sources_bytes_read_total{source="list"}'] == 0  # ints: no array bytes
    assert values["grain_python_dataset_next_duration_ns_count"] > 0


def test_setup_telemetry_serves_from_the_main_process_only():
    code = r"""
import multiprocessing, os
from unittest import mock
from grainlike.core import monitoring
os.environ.update(ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY="true")
for name in ("MainProcess", "Worker-1"):
    process = mock.Mock()
    process.name = name
    with mock.patch("multiprocessing.current_process", return_value=process), \
         mock.patch.object(monitoring, "initialize") as initialize:
        monitoring.setup_telemetry()
    print(name, initialize.call_count)
"""
    assert _run(code).split() == ["MainProcess", "1", "Worker-1", "0"]
