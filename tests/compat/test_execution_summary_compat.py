"""grain's execution statistics on grainlike: ``get_execution_summary``, its protobuf, debug mode's table.

The same pipelines run on grain 0.2.18 and on grainlike, with debug mode on or
``ExecutionTrackingMode.STAGE_TIMING``, for the same number of ``next()``
calls; the summaries have the same nodes (ids, names, inputs, output and
prefetch flags, output specs) and the output node the same count. A stage
below the output may count more elements on grainlike: grain rebuilds its
statistics tree when the output stage first records (so the elements its
first output took are not counted below it), and grainlike's chunked reads
run ahead (docs/migrating.md).
"""

from __future__ import annotations

import copy
import importlib
import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _plus_one(x):
    return x + 1


def _not_multiple_of_3(x):
    return x % 3 != 0


def _as_dict(x):
    return {"x": x, "twice": np.asarray([x, x])}


@pytest.fixture(scope="module")
def libs(grain_ref):
    """[(library, its ``_src...dataset.dataset`` module)] for grain, then grainlike."""
    import grain

    import grainlike

    return [
        (grain, importlib.import_module("grain._src.python.dataset.dataset")),
        (grainlike, importlib.import_module("grainlike._src.python.dataset.dataset")),
    ]


@pytest.fixture
def debug_mode(libs):
    for lib, _ in libs:
        lib.config.update("py_debug_mode", True)
    try:
        yield
    finally:
        for lib, _ in libs:
            lib.config.update("py_debug_mode", False)


def _map_stages(g):
    read = g.ReadOptions(prefetch_buffer_size=0)
    return g.MapDataset.range(20).shuffle(42).map(_plus_one).batch(2).to_iter_dataset(read)


def _iter_stages(g):
    return g.MapDataset.source(list(range(30))).to_iter_dataset().map(_plus_one).filter(_not_multiple_of_3).batch(2)


def _dict_elements(g):
    read = g.ReadOptions(prefetch_buffer_size=0)
    return g.MapDataset.range(10).map(_as_dict).to_iter_dataset(read).map(_as_dict)


def _read_ahead(g):
    return g.MapDataset.range(40).shuffle(7).map(_plus_one).to_iter_dataset().batch(4)


def _stage_timing(g):
    ds = g.MapDataset.range(20).map(_plus_one).to_iter_dataset(g.ReadOptions(prefetch_buffer_size=0)).batch(3)
    options = g.experimental.DatasetOptions(execution_tracking_mode=g.experimental.ExecutionTrackingMode.STAGE_TIMING)
    return g.experimental.WithOptionsIterDataset(ds, options)


def _summary(lib, module, build, steps):
    it = iter(build(lib))
    for _ in range(steps):
        next(it)
    if lib.__name__ == "grain":
        it._stats.report()  # grain folds what it recorded in every 5 s; grainlike's is up to date
    return it, module.get_execution_summary(it)


def _shape(node):
    return (node.id, node.name, list(node.inputs), node.is_output, node.is_prefetch, node.output_spec)


def _check_timings(summary):
    for node in summary.nodes.values():
        if node.num_produced_elements:
            assert 0 <= node.min_processing_time_ns <= node.max_processing_time_ns <= node.total_processing_time_ns
        else:
            assert node.total_processing_time_ns == 0
    assert summary.nodes[0].total_processing_time_ns > 0
    ratios = [n.wait_time_ratio for n in summary.nodes.values() if not n.is_prefetch]
    assert all(0 <= r <= 1 for r in ratios)


@pytest.mark.parametrize(
    "build, exact", [(_map_stages, True), (_iter_stages, False), (_dict_elements, False), (_read_ahead, False)]
)
def test_summaries_have_grains_nodes_in_debug_mode(libs, debug_mode, build, exact):
    (grain, grain_dataset), (ours, our_dataset) = libs
    _, theirs = _summary(grain, grain_dataset, build, 3)
    it, mine = _summary(ours, our_dataset, build, 3)
    assert [_shape(mine.nodes[i]) for i in sorted(mine.nodes)] == [_shape(theirs.nodes[i]) for i in sorted(theirs.nodes)]
    assert mine.nodes[0].num_produced_elements == theirs.nodes[0].num_produced_elements == 3
    for i in mine.nodes:
        if exact:  # one element at a time, no read-ahead: the same counts everywhere
            assert mine.nodes[i].num_produced_elements == theirs.nodes[i].num_produced_elements, i
        elif build is not _read_ahead:
            assert mine.nodes[i].num_produced_elements >= theirs.nodes[i].num_produced_elements, i
    _check_timings(mine)
    next(it)
    assert our_dataset.get_execution_summary(it).nodes[0].num_produced_elements == 4


def test_stage_timing_collects_without_debug_mode(libs):
    (grain, grain_dataset), (ours, our_dataset) = libs
    _, theirs = _summary(grain, grain_dataset, _stage_timing, 4)
    _, mine = _summary(ours, our_dataset, _stage_timing, 4)
    assert [_shape(mine.nodes[i]) for i in sorted(mine.nodes)] == [_shape(theirs.nodes[i]) for i in sorted(theirs.nodes)]
    assert mine.nodes[0].num_produced_elements == theirs.nodes[0].num_produced_elements == 4
    _check_timings(mine)


def test_prefetch_nodes_count_bytes_as_grains(libs, debug_mode):
    (grain, grain_dataset), (ours, our_dataset) = libs
    _, theirs = _summary(grain, grain_dataset, _map_stages, 3)
    _, mine = _summary(ours, our_dataset, _map_stages, 3)
    # Three batches of two int64s handed over; what was read is at least that (grainlike reads ahead).
    assert mine.nodes[0].bytes_produced == theirs.nodes[0].bytes_produced == 48
    assert mine.nodes[0].bytes_consumed >= theirs.nodes[0].bytes_consumed > 0
    assert all(n.bytes_produced == n.bytes_consumed == 0 for i, n in mine.nodes.items() if i)


def test_mp_prefetch_node_is_a_prefetch_output_over_its_workers_stages(libs, debug_mode):
    (grain, grain_dataset), (ours, our_dataset) = libs

    def parent(g):
        return g.MapDataset.range(20).map(_plus_one).to_iter_dataset().batch(3)

    def build(g):
        return parent(g).mp_prefetch(g.MultiprocessingOptions(num_workers=2))

    _, theirs = _summary(grain, grain_dataset, build, 3)
    it, mine = _summary(ours, our_dataset, build, 3)
    try:
        node = mine.nodes[0]
        assert (node.is_output, node.output_spec, node.num_produced_elements) == (
            True, theirs.nodes[0].output_spec, theirs.nodes[0].num_produced_elements)
        assert node.is_prefetch
        # Each worker batches its half (10 elements: 3 + 3 + 3 + 1), 8 batches in all. When
        # a worker's share ends it reports its statistics before the consumer hears of it.
        assert len(list(it)) == 5
        mine = our_dataset.get_execution_summary(it)
        node = mine.nodes[0]
        assert node.bytes_produced == node.bytes_consumed == 20 * 8
        # The workers' stages, added up, under it: those of the parent pipeline run in
        # one process (grain's nodes), each worker's share cut by a slice below the read.
        _, in_process = _summary(grain, grain_dataset, parent, 7)
        expected = [in_process.nodes[i].name for i in sorted(in_process.nodes)]
        expected.insert(2, "SliceMapDataset[0:20:2]")
        assert list(node.inputs) == [1]
        assert [mine.nodes[i].name for i in sorted(mine.nodes)][1:] == expected
        assert [list(mine.nodes[i].inputs) for i in sorted(mine.nodes)][1:] == [[2], [3], [4], [5], []]
        assert [mine.nodes[i].num_produced_elements for i in sorted(mine.nodes)] == [8, 8, 20, 20, 20, 20]
        assert [mine.nodes[i].is_output for i in sorted(mine.nodes)] == [True] + [False] * 5
        assert mine.nodes[1].output_spec == node.output_spec
        _check_timings(mine)
    finally:
        it.close()


def test_not_collected_is_grains_error(libs):
    messages = []
    for lib, module in libs:
        it = iter(lib.MapDataset.range(10).shuffle(42).to_iter_dataset())
        with pytest.raises(ValueError) as error:
            module.get_execution_summary(it)
        messages.append(str(error.value))
    assert messages[0] == messages[1]
    assert "STAGE_TIMING" in messages[1]


def test_statistics_off_leave_the_stages_as_they_are(libs):
    _, (ours, _) = libs
    ds = ours.MapDataset.range(10).map(_plus_one)
    it = iter(ds.to_iter_dataset().map(_plus_one).batch(2))
    assert "_stats" not in it.__dict__ and "_stats" not in ds.__dict__
    assert type(it).__name__ == "_BatchDatasetIterator" and "_untimed_class" not in type(it).__dict__
    assert [b.tolist() for b in it] == [[2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]


def test_a_timed_dataset_pickles_as_its_own_class(libs, debug_mode):
    _, (ours, our_dataset) = libs
    ds = ours.MapDataset.range(10).map(_plus_one)
    it = iter(ds.to_iter_dataset())
    next(it)
    assert "_untimed_class" in type(ds).__dict__
    copied = pickle.loads(pickle.dumps(ds))
    assert type(copied) is type(ds)._untimed_class and "_stats" not in copied.__dict__
    assert list(copied) == list(range(1, 11))


def test_wait_time_ratios_and_table_are_grains(libs, debug_mode):
    (grain, _), (ours, our_dataset) = libs
    from grainlike.dataset.summary_table import pretty_format_summary, sorted_by_wait_time

    grain_stats = importlib.import_module("grain._src.python.dataset.stats")
    _, mine = _summary(ours, our_dataset, _iter_stages, 5)
    theirs = copy.deepcopy(mine)
    for node in theirs.nodes.values():
        node.wait_time_ratio = 0
    grain_stats._populate_wait_time_ratio(theirs)
    assert {i: n.wait_time_ratio for i, n in mine.nodes.items()} == {i: n.wait_time_ratio for i, n in theirs.nodes.items()}
    assert abs(sum(n.wait_time_ratio for n in mine.nodes.values()) - 1) < 1e-3
    assert pretty_format_summary(mine) == grain_stats.pretty_format_summary(mine)
    grain_utils = importlib.import_module("grain._src.python.dataset.stats_utils")
    assert sorted_by_wait_time(mine) == grain_utils.sort_nodes_by_wait_time_ratio(copy.deepcopy(mine))


def test_table_formats_every_kind_of_cell_as_grain(grain_ref):
    from grainlike.dataset.summary_table import pretty_format_summary
    from grainlike.proto import execution_summary_pb2 as pb

    grain_stats = importlib.import_module("grain._src.python.dataset.stats")
    summary = pb.ExecutionSummary()
    rows = [
        dict(name="MapDatasetIterator(transform=" + "a_long_name_" * 20 + ")", inputs=[1], wait_time_ratio=0.5,
             min_processing_time_ns=400_000),
        dict(name="PrefetchDatasetIterator", inputs=[2], total_processing_time_ns=400_000, min_processing_time_ns=400,
             max_processing_time_ns=40_000, num_produced_elements=10, is_prefetch=True, bytes_consumed=3 << 31,
             bytes_produced=50_000),
        dict(name="MapMapDataset", inputs=[3, 4], wait_time_ratio=0.375, total_processing_time_ns=4_000_000_000,
             min_processing_time_ns=4000, max_processing_time_ns=40_000_000, num_produced_elements=7),
        dict(name="SourceMapDataset(source=x)", wait_time_ratio=0.125, total_processing_time_ns=999,
             min_processing_time_ns=5, max_processing_time_ns=900, num_produced_elements=3),
        dict(name="RangeMapDataset", bytes_consumed=5 << 40, is_prefetch=True),
    ]
    for i, row in enumerate(rows):
        summary.nodes[i].CopyFrom(pb.ExecutionSummary.Node(id=i, output_spec="int[]", **row))
    assert pretty_format_summary(summary) == grain_stats.pretty_format_summary(summary)


class _SlowSource:
    def __len__(self):
        return 10

    def __getitem__(self, index):
        time.sleep(0.005)
        return index


def test_debug_mode_logs_the_summary_periodically(libs, debug_mode, monkeypatch, caplog):
    _, (ours, _) = libs
    from grainlike.dataset import execution_stats

    monkeypatch.setattr(execution_stats, "_LOG_EXECUTION_SUMMARY_PERIOD_SEC", 0.05)
    caplog.set_level(logging.INFO)
    read = ours.ReadOptions(prefetch_buffer_size=0)
    it = iter(ours.MapDataset.source(_SlowSource()).map(_plus_one).to_iter_dataset(read))
    assert list(it) == list(range(1, 11))
    deadline = time.monotonic() + 30
    while "Grain Dataset Execution Summary" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "Grain Dataset Execution Summary" in caplog.text
    assert "| num produced elements |" in caplog.text and "WARNING: Your source is likely the bottleneck" in caplog.text


def _summary_threads() -> set:
    return {t.ident for t in threading.enumerate() if t.name == "grainlike-execution-summary"}


def test_stage_timing_logs_nothing(libs, monkeypatch, caplog):
    _, (ours, our_dataset) = libs
    from grainlike.dataset import execution_stats

    monkeypatch.setattr(execution_stats, "_LOG_EXECUTION_SUMMARY_PERIOD_SEC", 0.05)
    # The logging threads of earlier tests' debug-mode iterators may still log
    # (a period after their last element): only this iterator's would count.
    earlier = _summary_threads()
    caplog.set_level(logging.INFO)
    it = iter(_stage_timing(ours))
    list(it)
    time.sleep(0.3)
    assert _summary_threads() <= earlier
    logged = [r for r in caplog.records if "Grain Dataset Execution Summary" in r.getMessage() and r.thread not in earlier]
    assert logged == []
    assert our_dataset.get_execution_summary(it).nodes[0].num_produced_elements == 7


def test_user_stage_records_through_its_stats(libs, debug_mode):
    _, (ours, our_dataset) = libs

    class Doubling(ours.DatasetIterator):
        def __init__(self, parent):
            super().__init__(parent)

        def __next__(self):
            x = next(self._parent)
            with self._stats.record_self_time():
                return self._stats.record_output_spec(2 * x)

        def get_state(self):
            return self._parent.get_state()

        def set_state(self, state):
            self._parent.set_state(state)

    class DoublingDataset(ours.IterDataset):
        def __iter__(self):
            return Doubling(self._parent.__iter__())

    it = iter(DoublingDataset(ours.MapDataset.range(5).to_iter_dataset(ours.ReadOptions(prefetch_buffer_size=0))))
    assert [next(it) for _ in range(3)] == [0, 2, 4]
    summary = our_dataset.get_execution_summary(it)
    assert (summary.nodes[0].num_produced_elements, summary.nodes[0].output_spec) == (3, "int[]")
    assert summary.nodes[1].is_prefetch and summary.nodes[2].name == "RangeMapDataset(start=0, stop=5, step=1)"


def _run(*parts: str) -> str:
    """Runs the code ``parts`` (each dedented) in a fresh process; returns its output."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    code = "\n".join(textwrap.dedent(part) for part in parts)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


_GRAIN = "import absl.flags; absl.flags.FLAGS.mark_as_parsed()\nfrom grain.proto import execution_summary_pb2 as theirs\n"
_OURS = "from grainlike.proto import execution_summary_pb2 as ours\n"
_SAME_FILE = """
from google.protobuf import descriptor_pb2
files = []
for module in (ours, theirs):
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    files.append(proto)
assert files[0] == files[1], files
print("same")
"""


@pytest.mark.parametrize("first", ["grainlike", "grain"])
def test_the_proto_file_is_grains_loaded_in_either_order(first):
    imports = _OURS + _GRAIN if first == "grainlike" else _GRAIN + _OURS
    assert _run(imports, _SAME_FILE).split() == ["same"]


def test_summaries_round_trip_between_grain_and_grainlike(tmp_path):
    # Each library in its own process, so each parses with its own classes.
    path = tmp_path / "summary.bin"
    _run(f"""
        import grainlike
        from grainlike._src.python.dataset.dataset import get_execution_summary
        grainlike.config.update("py_debug_mode", True)
        it = iter(grainlike.MapDataset.range(8).map(lambda x: x * 2).to_iter_dataset())
        [next(it) for _ in range(3)]
        open({str(path)!r}, "wb").write(get_execution_summary(it).SerializeToString())
    """)
    out = _run(_GRAIN, f"""
        import json
        summary = theirs.ExecutionSummary.FromString(open({str(path)!r}, "rb").read())
        print(json.dumps({{i: [n.name, list(n.inputs), n.num_produced_elements, n.is_output] for i, n in summary.nodes.items()}}))
        summary.nodes[5].name = "added by grain"
        open({str(path)!r}, "wb").write(summary.SerializeToString())
    """)
    nodes = json.loads(out)
    assert nodes["0"][2:] == [3, True] and nodes["0"][0].startswith("PrefetchDatasetIterator(")
    assert nodes["1"][0].startswith("MapMapDataset(") and nodes["2"][0] == "RangeMapDataset(start=0, stop=8, step=1)"
    out = _run(_OURS, f"""
        summary = ours.ExecutionSummary.FromString(open({str(path)!r}, "rb").read())
        print(summary.nodes[5].name, summary.nodes[0].num_produced_elements, sorted(summary.nodes))
    """)
    assert out.strip() == "added by grain 3 [0, 1, 2, 5]"


def test_import_grainlike_does_not_import_protobuf():
    out = _run("""
        import sys
        import grainlike
        from grainlike._src.python.dataset import dataset
        grainlike.config.update("py_debug_mode", True)
        it = iter(grainlike.MapDataset.range(8).to_iter_dataset().map(lambda x: x + 1))
        print([next(it) for _ in range(2)], "google.protobuf" in sys.modules, "grainlike.proto" in dir(grainlike) or "proto" in dir(grainlike))
        summary = dataset.get_execution_summary(it)
        print(summary.nodes[0].num_produced_elements, "google.protobuf" in sys.modules)
    """)
    assert out.split("\n")[:2] == ["[1, 2] False True", "2 True"]
