"""Platforms without Linux's calls (macOS): every default falls back to what the platform has.

Where ``os.memfd_create`` is missing, anonymous memory is a POSIX shared-memory
object unlinked as soon as it is opened; where ``os.fork`` is missing (and on
macOS), workers are spawned. The first tests take the calls away in this
process only; the last runs the worker and source tests in a fresh pytest with
the calls taken away at start-up in every process (``tests/platforms/
without_linux_calls/sitecustomize.py``), workers included. docs/platforms.md
lists each difference with its test.
"""

import fcntl
import multiprocessing
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import grainlike as grain
from grainlike.sources.in_memory import InMemoryDataSource
from tests.helpers import leaks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WITHOUT_LINUX_CALLS = os.path.join(ROOT, "tests", "platforms", "without_linux_calls")
# The Linux-only calls the start-up hook removes.
LINUX_CALLS = ("memfd_create", "fork", "posix_fallocate")

pytestmark = pytest.mark.timeout(120)


def _fd_target(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def _fds_of(inode: int) -> list:
    """This process's descriptors of the segment with this inode."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if leaks.is_anonymous_segment(_fd_target(int(name))) and os.stat(f"/proc/self/fd/{name}").st_ino == inode:
                found.append(int(name))
        except OSError:
            pass  # closed meanwhile (the listing's own descriptor)
    return found


def test_without_memfd_create_anonymous_memory_is_an_unlinked_private_object(monkeypatch, no_leaks):
    data = {"x": np.arange(40).reshape(10, 4), "y": np.arange(10)}
    with InMemoryDataSource(data) as reference:
        expected = repr(reference)
    monkeypatch.delattr(os, "memfd_create", raising=False)
    before = leaks.shm_entries("grainlike-")
    with InMemoryDataSource(data) as source:
        target = _fd_target(source._fd)
        # A private name (the owner's pid, a random suffix), gone from /dev/shm at once.
        assert target.startswith(f"/dev/shm/grainlike-{os.getpid()}-") and target.endswith(" (deleted)")
        assert leaks.shm_entries("grainlike-") <= before
        # Read-only in place of the seals: no process holding it can write or map it writable.
        assert fcntl.fcntl(source._fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
        # The same source as with memfd_create: no name, the same records, the same checkpoint repr.
        assert source.name is None and repr(source) == expected
        np.testing.assert_array_equal(source[7]["x"], [28, 29, 30, 31])
        kept = source[2]
        inode = os.fstat(source._fd).st_ino
        assert _fds_of(inode) == [source._fd]
    assert _fds_of(inode) == []  # close() released the descriptor; the record keeps its mapping
    np.testing.assert_array_equal(kept["x"], [8, 9, 10, 11])
    del kept


def _start_method(x):
    return x, multiprocessing.current_process()._start_method, os.getpid()


def test_without_fork_workers_are_spawned_and_read_the_owners_memory(monkeypatch, no_leaks):
    monkeypatch.delattr(os, "fork", raising=False)
    with InMemoryDataSource(np.arange(12) * 10) as source:
        ds = grain.MapDataset.source(source).map(_start_method).to_iter_dataset()
        it = iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
        got = list(it)
        it.close()
    assert [(x, how) for x, how, _ in got] == [(x * 10, "spawn") for x in range(12)]
    workers = {pid for _, _, pid in got}
    assert len(workers) == 2 and os.getpid() not in workers


_SPAWNING_SCRIPT = """
import multiprocessing
import grainlike  # imported again by each spawned child as it prepares, before its parent is known
from grainlike.workers import server as worker_server


def servers(_):
    return len(worker_server._servers)


if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        print(pool.map(servers, range(4)))
"""


def test_spawned_children_importing_grainlike_start_no_worker_server(tmp_path):
    script = tmp_path / "spawning.py"
    script.write_text(_SPAWNING_SCRIPT)
    env = dict(os.environ, PYTHONPATH=ROOT)
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[0, 0, 0, 0]"


# A program whose socket module has no SO_PEERCRED (a platform without abstract
# sockets): its worker server listens in a 0700 folder of its own.
_FOLDER_SERVER = r"""
import os, socket, stat, sys
del socket.SO_PEERCRED
from grainlike.workers import server as w
s = w.running_server()
folder = os.path.dirname(s._forkserver_address)
print(os.path.basename(folder), oct(stat.S_IMODE(os.lstat(folder).st_mode)), os.listdir(folder) != [], flush=True)
if sys.argv[1] == "wait":
    sys.stdin.readline()
"""


def test_without_abstract_sockets_the_server_listens_in_a_private_folder_the_next_program_removes(request):
    # The server dies with the program when the whole group is killed, and
    # removes nothing then; the next program of this user that starts a server
    # does. Another user's folder, and a live process's, of the same shape stay.
    from tests.helpers.processes import in_session

    # A short TMPDIR: a socket's path has at most 103 characters on every platform.
    tmpdir = pathlib.Path(tempfile.mkdtemp(prefix="glt-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(tmpdir, ignore_errors=True))
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    with in_session([sys.executable, "-c", _FOLDER_SERVER, "wait"], env=env, stdin=subprocess.PIPE) as proc:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.wait(30) is not None else ""
        name, mode, has_socket = line.split()
        assert name.startswith(f"glsrv-{proc.pid}-") and mode == "0o700" and has_socket == "True", proc.stderr.read()
        os.killpg(proc.pid, 9)
        proc.wait(30)
    assert name in os.listdir(tmpdir)
    (tmpdir / f"glsrv-{os.getpid()}-alive").mkdir()
    run = subprocess.run([sys.executable, "-c", _FOLDER_SERVER, "exit"], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    # Its own folder goes too: its server removes it when it exits after the program.
    expected = [f"glsrv-{os.getpid()}-alive"]
    assert leaks.wait_until(lambda: sorted(os.listdir(tmpdir)) == expected, timeout=20), os.listdir(tmpdir)


# The tests run without the Linux-only calls: sources' shared memory (anonymous
# and named), InMemoryDataSource in workers, mp_prefetch, the DataLoader's and
# the pool's workers (spawned), liveness, SharedMemoryArray. Tests of fork,
# forkserver and /dev/shm's size are Linux's own and not among them.
SIMULATED = (
    "tests/test_platforms.py::test_without_memfd_create_anonymous_memory_is_an_unlinked_private_object",
    "tests/test_platforms.py::test_without_fork_workers_are_spawned_and_read_the_owners_memory",
    "tests/sources/test_in_memory.py::test_views_outlive_close_and_reads_after_close_raise",
    "tests/sources/test_in_memory.py::test_garbage_collecting_owner_releases_but_views_stay_valid",
    "tests/sources/test_in_memory.py::test_anonymous_memory_is_sealed_read_only_and_has_no_name",
    "tests/sources/test_in_memory.py::test_children_read_without_destroying_segment[spawn]",
    "tests/reliability/test_in_memory_anonymous.py::test_workers_map_the_owners_memory_not_a_copy[mp_prefetch]",
    "tests/reliability/test_in_memory_anonymous.py::test_workers_map_the_owners_memory_not_a_copy[worker_init_fn]",
    "tests/reliability/test_in_memory_anonymous.py::test_memory_is_released_when_the_last_reference_goes",
    "tests/reliability/test_in_memory_anonymous.py::test_a_killed_process_group_leaves_no_source_memory_behind",
    "tests/dataset/test_mp_prefetch.py::test_an_error_arrives_once_with_its_type_then_that_worker_counts_as_ended",
    "tests/dataset/test_mp_prefetch.py::test_big_batches_come_through_shared_memory_and_stay_valid",
    "tests/dataset/test_workers.py::test_outputs_are_round_robin_with_states_after_each[sizes1]",
    "tests/dataset/test_workers.py::test_unguarded_module_run_with_dash_m_does_not_run_again_in_workers",
    "tests/loader/test_workers.py::test_lambdas_and_local_classes_work_in_workers",
    "tests/loader/test_workers.py::test_big_arrays_come_through_shared_memory_and_are_freed",
    "tests/reliability/test_liveness.py::test_a_stopped_worker_is_reported_naming_it_and_why_it_has_no_stack",
    "tests/compat/test_shared_memory_array_compat.py",
)


def _without_linux_calls_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([WITHOUT_LINUX_CALLS, ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["JAX_PLATFORMS"] = "cpu"
    return env


def test_worker_and_source_tests_pass_without_linux_calls():
    env = _without_linux_calls_env()
    probe = f"import os, grainlike; print([n for n in {LINUX_CALLS!r} if hasattr(os, n)])"
    left = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert left.stdout.strip() == "[]", left.stderr  # the hook took them away
    start = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *SIMULATED],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=110,
    )
    took = time.monotonic() - start
    assert run.returncode == 0, f"{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-2000:]
    print(f"simulated-platform pass: {run.stdout.strip().splitlines()[-1]} ({took:.1f} s)")


def test_without_abstract_sockets_a_tmpdir_too_long_for_a_socket_is_a_clear_error(tmp_path):
    tmpdir = tmp_path / ("d" * 60)
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-c", _FOLDER_SERVER, "exit"], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "set TMPDIR to a shorter folder" in run.stderr and str(tmpdir) in run.stderr, run.stderr
    assert os.listdir(tmpdir) == []
