"""mp_prefetch's workers report their execution statistics to the consumer's summary.

See ``grainlike.dataset.parallel.worker_stats``: with statistics on, each worker
writes its summary into a private directory of the consumer's every 5 s and
when its share ends; ``get_execution_summary`` puts the workers' stages, added
up, under the ``mp_prefetch`` node. (The node-by-node comparison with grain's
names is in tests/compat/test_execution_summary_compat.py.)
"""

from __future__ import annotations

import gc
import glob
import os
import stat
import tempfile
import time

import pytest

import grainlike as grain
from grainlike._src.python.dataset.dataset import get_execution_summary
from grainlike.dataset.parallel import worker_stats

pytestmark = pytest.mark.timeout(120)


def _times_two(x):
    return x * 2


def _plus_one(x):
    return x + 1


def _odd(x):
    return x % 2 == 1


def _timed(ds):
    options = grain.experimental.DatasetOptions(
        execution_tracking_mode=grain.experimental.ExecutionTrackingMode.STAGE_TIMING)
    return grain.experimental.WithOptionsIterDataset(ds, options)


def _pipeline(n, workers=2):
    ds = grain.MapDataset.range(n).to_iter_dataset().map(_plus_one).filter(_odd).batch(4)
    return ds, ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))


def _names(summary):
    return [summary.nodes[i].name.split("(")[0] for i in sorted(summary.nodes)]


def test_workers_stages_count_every_element_after_the_last():
    ds = grain.MapDataset.range(101).map(_times_two).to_iter_dataset().filter(lambda x: x % 3 == 0).batch(4)
    it = iter(_timed(ds).mp_prefetch(grain.MultiprocessingOptions(num_workers=3)))
    batches = list(it)
    summary = get_execution_summary(it)
    assert _names(summary) == [
        "MultiprocessPrefetchDatasetIterator", "BatchDatasetIterator", "FilterDatasetIterator",
        "PrefetchDatasetIterator", "SliceMapDataset[0:101:3]", "MapMapDataset", "RangeMapDataset",
    ]
    counts = [summary.nodes[i].num_produced_elements for i in sorted(summary.nodes)]
    elements = sum(len(b) for b in batches)
    assert elements == len(range(0, 202, 6))  # the multiples of 3 among 0, 2, ..., 200
    assert counts[:3] == [len(batches), len(batches), elements]
    # The stages below the filter read all 101 records, in three shares.
    assert counts[4:] == [101, 101, 101]
    assert [list(summary.nodes[i].inputs) for i in sorted(summary.nodes)] == [[1], [2], [3], [4], [5], [6], []]
    assert sum(n.wait_time_ratio for n in summary.nodes.values()) == pytest.approx(1, abs=0.01)
    it.close()


def test_a_running_worker_reports_every_few_seconds():
    _, mp = _pipeline(10**7)
    it = iter(_timed(mp))
    next(it)
    # Its share does not end: what it has done reaches the summary by the periodic report.
    deadline = time.monotonic() + 30
    while len(get_execution_summary(it).nodes) == 1:
        assert time.monotonic() < deadline, "no worker reported within 30 s"
        time.sleep(0.2)
    summary = get_execution_summary(it)
    assert _names(summary)[:3] == ["MultiprocessPrefetchDatasetIterator", "BatchDatasetIterator", "FilterDatasetIterator"]
    assert summary.nodes[1].num_produced_elements >= 1
    it.close()


def test_debug_mode_alone_makes_the_workers_collect():
    grain.config.update("py_debug_mode", True)
    try:
        _, mp = _pipeline(40)
        it = iter(mp)
        batches = list(it)
    finally:
        grain.config.update("py_debug_mode", False)
    summary = get_execution_summary(it)
    assert _names(summary)[1:4] == ["BatchDatasetIterator", "FilterDatasetIterator", "MapDatasetIterator"]
    assert summary.nodes[1].num_produced_elements == len(batches)
    it.close()


def test_without_statistics_there_is_no_report_directory(tmp_path, monkeypatch):
    # This process's temporary files go to tmp_path (tests in other processes use /tmp too).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _, mp = _pipeline(40)
    it = iter(mp)
    assert sum(len(b) for b in it) == 20
    with pytest.raises(ValueError):
        get_execution_summary(it)
    assert it._reports is None and it._task.stats_dir is None
    assert glob.glob(str(tmp_path / "grainlike-stats-*")) == []
    it.close()
    # With statistics, the directory would be there.
    it = iter(_timed(mp))
    list(it)
    assert glob.glob(str(tmp_path / "grainlike-stats-*")) == [it._reports.path]
    it.close()


def test_the_report_directory_is_private_and_goes_with_the_iterator():
    _, mp = _pipeline(40)
    it = iter(_timed(mp))
    list(it)
    path = it._reports.path
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    files = os.listdir(path)
    assert sorted(files) == ["worker-0.pb", "worker-1.pb"]
    assert all(stat.S_IMODE(os.stat(os.path.join(path, f)).st_mode) == 0o600 for f in files)
    it.close()
    del it
    gc.collect()
    assert not os.path.exists(path)


def test_only_this_users_regular_files_that_parse_are_read(tmp_path):
    reports = worker_stats.ReportDir()
    try:
        ds = _timed(grain.MapDataset.range(6).to_iter_dataset().batch(2))
        source_it = iter(ds)
        list(source_it)
        good = source_it._stats._get_execution_summary().SerializeToString()
        with open(os.path.join(reports.path, "worker-0.pb"), "wb") as f:
            f.write(good)
        with open(os.path.join(reports.path, "worker-1.pb"), "wb") as f:
            f.write(b"\xff\xff not a protobuf message")
        target = tmp_path / "elsewhere.pb"
        target.write_bytes(good)
        os.symlink(target, os.path.join(reports.path, "worker-2.pb"))
        os.mkdir(os.path.join(reports.path, "worker-3.pb"))
        with open(os.path.join(reports.path, "notes.txt"), "wb") as f:
            f.write(good)
        summaries = reports.summaries()
        assert len(summaries) == 1
        assert summaries[0].SerializeToString() == good
    finally:
        reports.remove()
    assert not os.path.exists(reports.path)
