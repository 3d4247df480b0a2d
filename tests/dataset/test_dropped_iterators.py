"""An iterator nobody holds stops: its threads and worker processes end and its buffers are freed.

For every iterator that runs work of its own (read threads of ``to_iter_dataset``,
``ThreadPrefetchIterDataset``, ``mp_prefetch``, the DataLoader's iterator with 0
and 2 workers, ``DeviceIterator``'s read-ahead) and every way a program drops one
(``break`` out of a ``for`` loop, ``next(iter(ds))``, ``zip(range(n), ds)``,
``del it``): the threads and workers end, and the source stops being read.

How fast they stop (the target is 100 ms from the drop, plus the read a thread
is in the middle of; 20-35 ms here when the machine is idle) is measured by
``benchmarks/dropped_iterators.py`` (W15), not here: a loaded CI machine
stretched it to 0.7 s. The tests assert what does not depend on the machine's
load: the threads and workers end (a dropped iterator whose threads went on
would fill its buffer and then wait for ever), the reads after the drop are
only those in flight, and ``del`` does not wait for a transform in progress
(each slow element takes far longer than the bounds).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import textwrap
import time
import weakref

import numpy as np
import pytest

import grainlike as grain
from grainlike.dataset import MapDataset
from grainlike.dataset.nodes.options import MultiprocessingOptions, ReadOptions
from grainlike.dataset.transformations.thread_prefetch import ThreadPrefetchIterDataset
from tests.helpers.leaks import grainlike_threads, process_ended, worker_children
from tests.helpers.processes import run_in_session

pytestmark = pytest.mark.timeout(120)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# How long the tests wait for the threads and workers to end: far longer than
# stopping takes even on a loaded machine, far shorter than the elements the
# slow transforms below are in the middle of.
_WAIT_S = 10.0
# What ``del`` may take: it must not wait for a worker's element in progress
# (30 s below).
_DEL_S = 5.0
_RECORDS = 4000
# grain's read-ahead: 16 threads, 500 elements.
_READ = ReadOptions(num_threads=16, prefetch_buffer_size=500)


class CountingSource:
    """Records that take 2 ms to read; every read appends a byte to ``path`` (workers' reads too)."""

    def __init__(self, path: str, n: int = _RECORDS):
        self.path = path
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(0.002)
        with open(self.path, "ab") as f:
            f.write(b".")
        return i

    def reads(self) -> int:
        try:
            return os.path.getsize(self.path)
        except FileNotFoundError:
            return 0


def _loader(source: CountingSource, workers: int) -> grain.DataLoader:
    return grain.DataLoader(
        data_source=source,
        sampler=grain.IndexSampler(len(source), grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
        worker_count=workers,
        read_options=grain.ReadOptions(num_threads=16, prefetch_buffer_size=500),
    )


class _OnDevice:
    """Iterates ``loader`` through a ``DeviceIterator`` (a read-ahead thread putting batches on JAX's device)."""

    def __init__(self, loader: grain.DataLoader):
        self._loader = loader

    def __iter__(self):
        from grainlike.jax.device_iterator import DeviceIterator

        return DeviceIterator(iter(self._loader), prefetch=2)


# Each kind: (build the iterable from a source, worker processes it runs).
KINDS = {
    "read_threads": (lambda s: MapDataset.source(s).to_iter_dataset(_READ), 0),
    "thread_prefetch": (
        lambda s: ThreadPrefetchIterDataset(MapDataset.source(s).to_iter_dataset(_READ), prefetch_buffer_size=100),
        0,
    ),
    "mp_prefetch": (
        lambda s: MapDataset.source(s).to_iter_dataset(_READ).mp_prefetch(MultiprocessingOptions(num_workers=2)),
        2,
    ),
    "loader_0_workers": (lambda s: _loader(s, 0), 0),
    "loader_2_workers": (lambda s: _loader(s, 2), 2),
    "device_0_workers": (lambda s: _OnDevice(_loader(s, 0)), 0),
    "device_2_workers": (lambda s: _OnDevice(_loader(s, 2)), 2),
}


def _drop_after_break(ds) -> None:
    for _ in ds:
        break


def _drop_after_next_iter(ds) -> None:
    next(iter(ds))


def _drop_after_zip(ds) -> None:
    for _ in zip(range(3), ds):
        pass


def _drop_by_del(ds) -> None:
    it = iter(ds)
    next(it)
    del it


PATTERNS = {
    "break": _drop_after_break,
    "next_iter": _drop_after_next_iter,
    "zip": _drop_after_zip,
    "del": _drop_by_del,
}


def _seconds_until(predicate, timeout: float = _WAIT_S):
    """Seconds until ``predicate()`` holds (polled every 2 ms); None if it did not within ``timeout``."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            return None
        time.sleep(0.002)


@pytest.fixture
def source(tmp_path):
    return CountingSource(str(tmp_path / "reads"))


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("kind", KINDS)
def test_dropped_iterator_stops_its_threads_workers_and_reads(kind, pattern, source, no_leaks):
    build, workers = KINDS[kind]
    ds = build(source)
    threads, children = grainlike_threads(), worker_children()
    PATTERNS[pattern](ds)  # The iterator is dropped before this returns.
    reads_at_drop = source.reads()
    took = _seconds_until(lambda: grainlike_threads() <= threads and worker_children() <= children)
    assert took is not None, (
        f"{_WAIT_S} s after the drop: threads {grainlike_threads() - threads}, workers {worker_children() - children}"
    )
    reads = source.reads()
    time.sleep(0.2)
    assert source.reads() == reads, "the source is still being read"
    if not kind.startswith("device"):
        # (A DeviceIterator's thread first finishes the batch it is reading, while
        # the loader's read threads go on, and only then lets go of the loader.)
        if workers == 0:
            # The drop stops the read threads at once: only the reads in progress
            # finish (16 threads, at most 8 records each), not the rest of the
            # 500-record buffer.
            assert reads - reads_at_drop <= 16 * 8
        else:
            # A worker hears of the drop a moment later (on a loaded machine, a
            # fraction of a second: 320 reads were seen), and reads on until then;
            # never the rest of its 500-record buffer.
            assert reads - reads_at_drop < 500 * workers


@pytest.mark.parametrize("kind", KINDS)
def test_del_returns_at_once_and_the_iterator_is_freed_without_gc(kind, source, no_leaks):
    build, _ = KINDS[kind]
    it = iter(build(source))
    next(it)
    ref = weakref.ref(it)
    gc.disable()  # Freed by its reference count: no cycle keeps it.
    try:
        start = time.monotonic()
        del it
        took = time.monotonic() - start
        assert ref() is None
    finally:
        gc.enable()
    assert took < _DEL_S, f"del took {took:.3f} s"


@pytest.mark.parametrize("kind", KINDS)
def test_reference_count_does_not_grow_while_iterating(kind, source, no_leaks):
    build, _ = KINDS[kind]
    it = iter(build(source))
    next(it)
    count = sys.getrefcount(it)
    for _ in range(20):
        next(it)
    assert sys.getrefcount(it) == count
    it.close()


@pytest.mark.parametrize("kind", KINDS)
def test_explicit_close_stops_the_iterator(kind, source, no_leaks):
    build, _ = KINDS[kind]
    threads, children = grainlike_threads(), worker_children()
    it = iter(build(source))
    next(it)
    it.close()
    took = _seconds_until(lambda: grainlike_threads() <= threads and worker_children() <= children)
    assert took is not None, (
        f"{_WAIT_S} s after close(): threads {grainlike_threads() - threads}, workers {worker_children() - children}"
    )
    with pytest.raises((ValueError, RuntimeError)):
        next(it)


def test_closing_while_a_prefetch_thread_reads_starts_no_read_threads(source, no_leaks):
    # close() (from the caller) races the prefetch thread's next read of the
    # parent: no read threads may start after the parent is closed.
    threads = grainlike_threads()
    for _ in range(50):
        it = iter(KINDS["thread_prefetch"][0](source))
        next(it)
        it.close()
    took = _seconds_until(lambda: grainlike_threads() <= threads)
    assert took is not None, f"threads left: {grainlike_threads() - threads}"
    del it


@pytest.mark.parametrize("kind", KINDS)
def test_an_iterator_still_held_goes_on_after_everything_else_is_dropped(kind, source, no_leaks):
    build, _ = KINDS[kind]
    ds = build(source)
    it = iter(ds)
    first = next(it)
    del ds
    gc.collect()
    time.sleep(0.05)
    rest = [int(np.asarray(x)) for _, x in zip(range(40), it)]
    assert [int(np.asarray(first))] + rest == list(range(41))
    it.close()


def test_a_wrapped_iterator_still_held_is_not_closed_when_its_device_iterator_is_dropped(source, no_leaks):
    from grainlike.jax.device_iterator import DeviceIterator

    inner = iter(_loader(source, 0))
    device = DeviceIterator(inner, prefetch=2)
    assert int(np.asarray(next(device))) == 0
    threads = grainlike_threads() - {"grainlike-device-prefetch"}
    del device
    assert _seconds_until(lambda: "grainlike-device-prefetch" not in grainlike_threads()) is not None
    # The device thread had read ahead of the caller: the inner iterator goes on
    # from where that thread left it, and is still open.
    value = int(np.asarray(next(inner)))
    assert 1 <= value <= 4
    assert grainlike_threads() >= threads
    inner.close()


def test_filter_stages_leave_no_reference_cycle(no_leaks):
    # Past the first window of filter checks (1000 elements), where each stage
    # has built the checker that names it.
    ds = MapDataset.range(3000).filter(lambda x: x % 7 != 0).to_iter_dataset(_READ).filter(lambda x: x % 5 != 0)
    it = iter(ds)
    for _ in range(1500):
        next(it)
    refs = [weakref.ref(it), weakref.ref(it._parent)]
    gc.disable()
    try:
        del it
        assert [r() for r in refs] == [None, None]
    finally:
        gc.enable()


class _Slow(grain.MapTransform):
    """Element 0 at once, every other one in 30 s."""

    def map(self, x):
        if x > 0:
            time.sleep(30)
        return x


def test_dropping_an_mp_iterator_does_not_wait_for_a_busy_worker(no_leaks):
    children = worker_children()
    ds = MapDataset.range(100).map(_Slow()).to_iter_dataset().mp_prefetch(MultiprocessingOptions(num_workers=2))
    it = iter(ds)
    next(it)  # Both workers are now in the middle of their next 30-second element.
    start = time.monotonic()
    del it
    took = time.monotonic() - start
    assert took < _DEL_S, f"del waited {took:.3f} s for the workers"
    gone = _seconds_until(lambda: worker_children() <= children)
    assert gone is not None, f"the workers were still there {_WAIT_S} s after the drop"


class _DeafToSigterm(grain.MapTransform):
    """After element 0, ignores SIGTERM (as native code in a long call can): only SIGKILL ends it.

    Creates ``ignoring`` once SIGTERM is ignored.
    """

    def __init__(self, ignoring: str):
        self.ignoring = ignoring

    def map(self, x):
        if x > 0:
            import ctypes
            import signal

            # Process-wide, from the worker's read thread (signal.signal needs the main thread).
            ctypes.CDLL(None).signal(int(signal.SIGTERM), 1)  # SIG_IGN
            open(self.ignoring, "a").close()
            time.sleep(30)
        return x


def test_del_does_not_wait_for_a_worker_that_must_be_killed(no_leaks, tmp_path):
    children = worker_children()
    ignoring = tmp_path / "ignoring"
    ds = MapDataset.range(10).map(_DeafToSigterm(str(ignoring))).to_iter_dataset()
    it = iter(ds.mp_prefetch(MultiprocessingOptions(num_workers=1)))
    assert next(it) == 0
    # The worker is now in element 1, ignoring SIGTERM.
    assert _seconds_until(ignoring.exists, timeout=30) is not None
    start = time.monotonic()
    del it
    took = time.monotonic() - start
    assert took < _DEL_S, f"del waited {took:.3f} s for the worker"
    # Asked, then 0.03 s, SIGTERM (ignored), 1 s, SIGKILL.
    gone = _seconds_until(lambda: worker_children() <= children)
    # Killed after the second's grace, long before its 30 s element ends.
    assert gone is not None and 1.0 <= gone < 1.0 + _DEL_S, gone


_EXIT_AFTER_DROP = """
import ctypes, json, os, signal, sys, time
import grainlike as grain
from grainlike.dataset import MapDataset
from grainlike.dataset.nodes.options import MultiprocessingOptions

class DeafToSigterm(grain.MapTransform):
    def map(self, x):
        if x == 1:
            ctypes.CDLL(None).signal(int(signal.SIGTERM), 1)  # SIG_IGN, from a read thread
            print(os.getpid(), file=sys.stderr, flush=True)
            time.sleep(30)
        return x

if __name__ == "__main__":
    it = iter(MapDataset.range(10).map(DeafToSigterm()).to_iter_dataset().mp_prefetch(MultiprocessingOptions(num_workers=1)))
    assert next(it) == 0
    time.sleep(1)
    del it  # Returns at once; the worker is stopped in the background.
    print("dropped", flush=True)
"""


def test_exit_right_after_a_drop_leaves_no_worker_behind(tmp_path):
    script = tmp_path / "exit_after_drop.py"
    script.write_text(_EXIT_AFTER_DROP)
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc, out, err = run_in_session([sys.executable, str(script)], timeout=60, env=env)
    assert proc.returncode == 0 and out.strip() == "dropped", err
    pids = {int(line) for line in err.split() if line.isdigit()}
    assert len(pids) == 1, err
    (pid,) = pids
    assert process_ended(pid)


_MEMORY_SCRIPT = """
import json, sys, threading, time
import numpy as np, psutil
from grainlike.dataset import MapDataset
from grainlike.dataset.nodes.options import ReadOptions
from grainlike.dataset.transformations.thread_prefetch import ThreadPrefetchIterDataset
import grainlike as grain

class Big:  # 1 MiB elements: a full 500-element buffer would be 500 MiB.
    def __len__(self):
        return 2000
    def __getitem__(self, i):
        time.sleep(0.001)
        return np.full(1 << 18, i, np.float32)

kind = sys.argv[1]
options = ReadOptions(num_threads=16, prefetch_buffer_size=500)
if kind == "read_threads":
    ds = MapDataset.source(Big()).to_iter_dataset(options)
elif kind == "thread_prefetch":
    ds = ThreadPrefetchIterDataset(MapDataset.source(Big()).to_iter_dataset(options), prefetch_buffer_size=500)
else:
    ds = grain.DataLoader(data_source=Big(), sampler=grain.SequentialSampler(2000, grain.NoSharding()),
                          read_options=grain.ReadOptions(num_threads=16, prefetch_buffer_size=500))
process = psutil.Process()
before = peak = process.memory_info().rss
for x in ds:
    break
del x
start = time.monotonic()
while time.monotonic() - start < 1.5:
    peak = max(peak, process.memory_info().rss)
    time.sleep(0.01)
threads = [t.name for t in threading.enumerate() if t.name.startswith("grainlike")]
print(json.dumps({"peak_mib": (peak - before) / 2**20, "threads": threads}))
"""


@pytest.mark.parametrize("kind", ["read_threads", "thread_prefetch", "loader_0_workers"])
def test_a_dropped_iterator_does_not_fill_its_buffer(kind, tmp_path):
    script = tmp_path / "memory.py"
    script.write_text(textwrap.dedent(_MEMORY_SCRIPT))
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc, out, err = run_in_session([sys.executable, str(script), kind], timeout=90, env=env)
    assert proc.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["threads"] == []
    # The reads in flight at the drop: at most 16 threads' reads of about 1 MiB
    # each, and the elements already read; far from the 500 MiB of the buffer.
    assert result["peak_mib"] < 150, result



@pytest.mark.parametrize("module", ["grainlike.loader.data_loader", "grainlike.dataset.nodes.iterator"])
def test_a_finalizer_during_interpreter_teardown_stays_silent(monkeypatch, module):
    """At exit CPython sets module globals to None before the last iterators go:
    their finalizers must neither raise nor print."""
    import gc
    import importlib
    import sys

    import grainlike as gl

    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    it = iter(
        gl.DataLoader(
            data_source=gl.RangeDataSource(0, 8, 1),
            sampler=gl.IndexSampler(8, gl.NoSharding(), shuffle=False, num_epochs=1),
            operations=[gl.Batch(4)],
        )
    )
    ds_it = iter(gl.MapDataset.range(8).to_iter_dataset())
    next(it), next(ds_it)
    monkeypatch.setattr(importlib.import_module(module), "close_dropped", None)
    del it, ds_it
    gc.collect()
    assert unraisable == []
