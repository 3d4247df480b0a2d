"""Shared memory: a full /dev/shm raises; batches and sources do not need /dev/shm at all.

The only named segments are those of an ``InMemoryDataSource`` created with
``name=``; batches and sources without a name live in anonymous memory.
"""

import errno
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from grainlike.core import shm_owner
from grainlike.sources.in_memory import InMemoryDataSource
from tests.helpers import leaks
from tests.helpers.processes import in_session, run_in_session

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = "grainlike_src_"

pytestmark = pytest.mark.timeout(60)


def test_a_source_larger_than_the_free_shared_memory_raises_before_writing(no_leaks, monkeypatch):
    monkeypatch.setattr(shm_owner, "free_bytes", lambda: 1 << 20)
    name = f"{PREFIX}{os.getpid()}_full"
    with pytest.raises(shm_owner.SharedMemoryFullError) as info:
        InMemoryDataSource(np.zeros(2 << 20, np.uint8), name=name)
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC
    message = str(info.value)
    assert "needs 2.0 MiB" in message and "which has 1.0 MiB free" in message
    assert "--shm-size" in message and "leave out name=" in message
    assert name not in leaks.shm_entries(PREFIX)
    # Without a name the data does not go to /dev/shm: the same free space is enough.
    with InMemoryDataSource(np.zeros(2 << 20, np.uint8)) as source:
        assert source[(2 << 20) - 1] == 0


_SMALL_SHM = """
import sys
sys.path.insert(0, {root!r})
import numpy as np
from grainlike.core import shm_owner
from grainlike.sources.in_memory import InMemoryDataSource

shm_owner.check_free = lambda what, size: None  # as if the space went between check and write
try:
    InMemoryDataSource(np.zeros(3 << 20, np.uint8), name="grainlike_src_full")
except shm_owner.SharedMemoryFullError as e:
    print("raised", e.errno, flush=True)
import os
print("left", os.listdir("/dev/shm"), flush=True)
"""


def _run_with_a_small_dev_shm(tmp_path, body):
    """Runs ``body`` (a script) with a real 1 MiB /dev/shm, in a mount namespace of its own."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed; the tests above cover the rules")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a mount namespace here: {probe.stderr.decode().strip()}")
    script = tmp_path / "small.py"
    script.write_text(textwrap.dedent(body.format(root=ROOT)))
    proc, out, err = run_in_session(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs /dev/shm && exec {sys.executable} {script}"],
        timeout=40,
    )
    assert proc.returncode == 0, err  # not -SIGBUS
    return out


def test_a_full_dev_shm_raises_instead_of_a_bus_error(no_leaks, tmp_path):
    out = _run_with_a_small_dev_shm(tmp_path, _SMALL_SHM)
    assert f"raised {errno.ENOSPC}" in out
    assert "left []" in out


_BIG_BATCHES = """
import sys
sys.path.insert(0, {root!r})
import grainlike as grain
from tests.reliability.transforms import Big

loader = grain.DataLoader(
    data_source=list(range(32)),
    sampler=grain.IndexSampler(32, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
    operations=[Big(), grain.Batch(8)], worker_count=2, worker_buffer_size=2)
batches = list(loader)
print("bytes", batches[0].nbytes, flush=True)
print("firsts", *[int(b[0, 0, 0]) for b in batches], flush=True)
"""


def test_batches_larger_than_dev_shm_come_through(no_leaks, tmp_path):
    # Batches of 2 MiB with 1 MiB of /dev/shm: they do not use it.
    import grainlike as grain
    from tests.reliability.transforms import Big

    out = _run_with_a_small_dev_shm(tmp_path, _BIG_BATCHES)
    assert "bytes 2097152" in out
    loader = grain.DataLoader(  # the same loader, here
        data_source=list(range(32)),
        sampler=grain.IndexSampler(32, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
        operations=[Big(), grain.Batch(8)], worker_count=2, worker_buffer_size=2)
    with iter(loader) as it:
        firsts = [int(b[0, 0, 0]) for b in it]
    assert f"firsts {' '.join(map(str, firsts))}" in out


_BIG_SOURCE = """
import os, sys
sys.path.insert(0, {root!r})
import numpy as np
import grainlike as grain

data = np.arange(8 << 20, dtype=np.uint8).reshape(256, 32768)  # 8 MiB
source = grain.InMemoryDataSource(data)
loader = grain.DataLoader(
    data_source=source,
    sampler=grain.IndexSampler(256, grain.NoSharding(), shuffle=True, num_epochs=1, seed=3),
    operations=[grain.Batch(16)], worker_count=2)
sums = [int(b.sum(dtype=np.int64)) for b in loader]
print("sums", sum(sums), int(data.sum(dtype=np.int64)), flush=True)
print("left", os.listdir("/dev/shm"), flush=True)
"""


def test_a_source_larger_than_dev_shm_is_read_by_workers(no_leaks, tmp_path):
    # An 8 MiB anonymous source with 1 MiB of /dev/shm: neither it nor the
    # batches use /dev/shm (a named segment there would die with SIGBUS or ENOSPC).
    out = _run_with_a_small_dev_shm(tmp_path, _BIG_SOURCE)
    total = int(np.arange(8 << 20, dtype=np.uint8).sum(dtype=np.int64))
    assert f"sums {total} {total}" in out
    assert "left []" in out


class _FdLimit:
    """A WorkerTask: each worker yields its own soft limit of open files."""

    def outputs(self, worker_index, worker_count, state, alloc):
        import resource

        yield state + 1, resource.getrlimit(resource.RLIMIT_NOFILE)

    def end_state(self, worker_index, worker_count, state):
        return state

    def pickling_error(self, error):
        return error


def test_workers_raise_their_own_open_file_limit(no_leaks):
    import resource

    from grainlike.workers.pool import WorkerPool

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(1 << 16, hard if hard != resource.RLIM_INFINITY else 1 << 16)
    with WorkerPool(_FdLimit(), 2, [0, 0]) as pool:
        limits = list(pool)
    assert [soft for soft, _ in limits] == [target, target]


# -- batches: anonymous memory ----------------------------------------------------------


class _Frames:
    """A WorkerTask: worker ``w`` yields ``count`` frames of 128 KiB (through shared memory)."""

    def __init__(self, count):
        self.count = count

    def outputs(self, worker_index, worker_count, state, alloc):
        for i in range(state, self.count):
            yield i + 1, np.full((128, 256), worker_index * 1000 + i, np.float32)

    def end_state(self, worker_index, worker_count, state):
        return state

    def pickling_error(self, error):
        return error


def _fd_count(pid="self"):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_holding_many_batches_costs_no_descriptors_in_either_process(no_leaks):
    from grainlike.workers.pool import WorkerPool

    count = 300
    with WorkerPool(_Frames(count), 1, [0], buffer_size=2) as pool:
        held = [next(pool) for _ in range(5)]
        consumer, worker = _fd_count(), _fd_count(pool.pids[0])
        held += [next(pool) for _ in range(count - 5)]  # every one in a segment of its own
        assert _fd_count() <= consumer + 2
        assert _fd_count(pool.pids[0]) <= worker + 2
        assert not leaks.own_shm_entries()  # no names in /dev/shm
    assert [int(a[0, 0]) for a in held] == list(range(count))
    assert all((a == i).all() for i, a in enumerate(held))  # still valid after close
    del held


_GROUP = """
import sys, time
sys.path.insert(0, {root!r})
import grainlike as grain
from tests.reliability.transforms import Big

loader = grain.DataLoader(
    data_source=list(range(64)),
    sampler=grain.IndexSampler(64, grain.NoSharding(), shuffle=False, num_epochs=None, seed=0),
    operations=[Big(), grain.Batch(2)], worker_count=2, worker_buffer_size=2)
it = iter(loader)
held = [next(it) for _ in range(6)]
print("ready", flush=True)
time.sleep(60)
"""


def test_a_killed_process_group_leaves_no_batch_memory_behind(no_leaks, tmp_path):
    script = tmp_path / "group.py"
    script.write_text(textwrap.dedent(_GROUP.format(root=ROOT)))
    with in_session([sys.executable, str(script)]) as proc:
        line = proc.stdout.readline()
        assert line.startswith("ready"), proc.stderr.read()
        # The held batches live in anonymous memory: mapped, but with no name in
        # /dev/shm that could outlive the processes or be deleted by another job.
        with open(f"/proc/{proc.pid}/maps") as f:
            assert "/memfd:grainlike-batch" in f.read()
        # (Named segments would carry its pid; other jobs' entries may come and go.)
        assert not leaks.shm_entries(f"grainlike_{proc.pid}_")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert leaks.wait_until(lambda: not leaks.session_processes(proc.pid))
        assert not leaks.shm_entries(f"grainlike_{proc.pid}_")
