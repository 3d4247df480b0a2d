"""Named shared memory: the sweep never deletes what another job owns; a full /dev/shm raises.

Covers ``InMemoryDataSource`` segments, the only named ones: their names carry
an owner identity (pid, PID namespace, start time) that the sweep verifies.
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
from grainlike.dataset import shm
from grainlike.sources.in_memory import InMemoryDataSource
from tests.helpers import leaks
from tests.helpers.processes import run_in_session

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = "grainlike_src_"

pytestmark = pytest.mark.timeout(60)


def _ns():
    return os.stat("/proc/self/ns/pid").st_ino


def _start_time(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


@pytest.fixture
def segments():
    """Creates files in /dev/shm as other processes would; removes what is left."""
    made = []

    def make(name, uid=None):
        path = os.path.join("/dev/shm", name)
        with open(path, "wb") as f:
            f.write(b"x")
        if uid is not None:
            os.chown(path, uid, -1)
        made.append(name)
        return name

    yield make
    for name in made:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except FileNotFoundError:
            pass


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_new_source_name_records_its_owner(no_leaks):
    with InMemoryDataSource(np.arange(4)) as source:
        pid, ns, start, token = source.name[len(PREFIX):].split("_")
        assert (int(pid), int(ns), int(start)) == (os.getpid(), _ns(), _start_time(os.getpid()))
        assert source.name in leaks.shm_entries(PREFIX)
        shm.sweep_orphans()  # its owner (this process) is alive
        assert source[3] == 3


def test_the_sweep_removes_only_segments_whose_owner_is_provably_dead(no_leaks, segments, sleeper):
    ns, dead = _ns(), _dead_pid()
    live, live_start = sleeper.pid, _start_time(sleeper.pid)
    removed = {
        "dead owner": segments(f"{PREFIX}{dead}_{ns}_123_aaaa0001"),
        "pid reused by another process": segments(f"{PREFIX}{live}_{ns}_{live_start + 1}_aaaa0002"),
    }
    kept = {
        "live owner": segments(f"{PREFIX}{live}_{ns}_{live_start}_aaaa0003"),
        # A pid that this namespace cannot see may be alive in the other one.
        "another PID namespace": segments(f"{PREFIX}{dead}_{ns + 1}_123_aaaa0004"),
        "another user": segments(f"{PREFIX}{dead}_{ns}_123_aaaa0005", uid=65534),
        "a name without an owner identity": segments(f"{PREFIX}{dead}_aaaa0006"),
    }
    assert shm.sweep_orphans() >= 2
    left = leaks.shm_entries(PREFIX)
    for why, name in removed.items():
        assert name not in left, why
    for why, name in kept.items():
        assert name in left, why


_OTHER_NAMESPACE = """
import sys
sys.path.insert(0, {root!r})
import numpy as np
from grainlike.sources.in_memory import InMemoryDataSource

source = InMemoryDataSource(np.arange(1000))
print(source.name, flush=True)
sys.stdin.readline()                # meanwhile the other namespace sweeps
print("read", int(source[999]), flush=True)
source.close()
"""


def test_a_live_source_in_another_pid_namespace_survives_the_sweep(no_leaks, tmp_path):
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed; the sweep rule is covered by the test above")
    probe = subprocess.run(["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a PID namespace here: {probe.stderr.decode().strip()}")
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent(_OTHER_NAMESPACE.format(root=ROOT)))
    proc = subprocess.Popen(
        ["unshare", "-p", "-f", "--mount-proc", sys.executable, str(script)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
        name = proc.stdout.readline().strip()
        assert name.startswith(PREFIX), proc.stderr.read()
        owner_pid = int(name[len(PREFIX):].split("_")[0])
        assert owner_pid < 10  # its pid in its own namespace: unknown or another process here
        shm.sweep_orphans()
        assert name in leaks.shm_entries(PREFIX)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "read 999"
        proc.wait(timeout=20)
        assert proc.returncode == 0, proc.stderr.read()
        assert name not in leaks.shm_entries(PREFIX)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()


def test_a_source_of_a_killed_process_is_swept_by_the_next_one(no_leaks, tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {ROOT!r})
        import numpy as np
        from grainlike.sources.in_memory import InMemoryDataSource
        source = InMemoryDataSource(np.arange(1000))
        print(source.name, flush=True)
        time.sleep(60)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        name = proc.stdout.readline().strip()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert name in leaks.shm_entries(PREFIX)  # nobody was left to unlink it
        with InMemoryDataSource(np.arange(3)):
            assert name not in leaks.shm_entries(PREFIX)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()


def test_a_source_larger_than_the_free_shared_memory_raises_before_writing(no_leaks, monkeypatch):
    monkeypatch.setattr(shm_owner, "free_bytes", lambda: 1 << 20)
    before = leaks.shm_entries(PREFIX)
    with pytest.raises(shm_owner.SharedMemoryFullError) as info:
        InMemoryDataSource(np.zeros(2 << 20, np.uint8))
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC
    message = str(info.value)
    assert "needs 2.0 MiB" in message and "which has 1.0 MiB free" in message
    assert "--shm-size" in message
    assert leaks.shm_entries(PREFIX) == before


_SMALL_SHM = """
import sys
sys.path.insert(0, {root!r})
import numpy as np
from grainlike.core import shm_owner
from grainlike.sources.in_memory import InMemoryDataSource

shm_owner.check_free = lambda what, size: None  # as if the space went between check and write
try:
    InMemoryDataSource(np.zeros(3 << 20, np.uint8))
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

    from grainlike.dataset.workers import WorkerPool

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
    from grainlike.dataset.workers import WorkerPool

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
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
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
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
