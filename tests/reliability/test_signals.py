"""A job's main process ended by a signal leaves nothing behind.

The script runs in its own session with its own ``TMPDIR``; once it has workers
it is sent the signal. Afterwards its ``TMPDIR`` must hold only what the script
made, no process of its session may remain, and ``/dev/shm`` no segment of it.
(Before: SIGTERM and SIGHUP left multiprocessing's ``pymp-*`` folder, with the
worker server's socket in it.)
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from tests.helpers import leaks
from tests.helpers.processes import in_session, run_in_session

pytestmark = pytest.mark.timeout(120)

_SCRIPT = r"""
import os, sys, time
import grainlike as grain
from grainlike.dataset import MapDataset

open(os.path.join(os.environ["TMPDIR"], "mine.txt"), "w").write("the script's own file")
{install}
ds = MapDataset.range(10**9).to_iter_dataset().map(lambda x: x + 1)
it = iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
next(it)
print("ready", flush=True)
while True:
    next(it)
    time.sleep(0.001)
"""

_USER_HANDLER = r"""
import signal
def _mine(signum, frame):
    open(os.path.join(os.environ["TMPDIR"], "handled.txt"), "w").write(str(signum))
    sys.exit(3)
signal.signal(signal.SIGTERM, _mine)
"""


def _run(tmp_path, sig, group=False, install=""):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    script = tmp_path / "job.py"
    script.write_text(_SCRIPT.replace("{install}", install))
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": os.getcwd(), "JAX_PLATFORMS": "cpu"}
    with in_session([sys.executable, str(script)], env=env) as proc:
        line = proc.stdout.readline()
        assert line.strip() == "ready", (line, proc.stderr.read() if proc.poll() is not None else "")
        sid = proc.pid
        if group:
            os.killpg(sid, sig)
        else:
            os.kill(proc.pid, sig)
        code = proc.wait(30)
        assert leaks.wait_until(lambda: not leaks.session_processes(sid), timeout=10), leaks.session_processes(sid)
        err = proc.stderr.read()
    shm = {n for n in leaks.shm_entries() if n.startswith((f"grainlike_{sid}_", f"grainlike_src_{sid}_"))}
    assert not shm
    return code, sorted(os.listdir(tmpdir)), err


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name
)
def test_a_signal_to_the_main_process_leaves_nothing_behind(tmp_path, sig):
    # SIGKILL: nothing runs in the killed process; the worker server, which exits
    # when it has gone, removes its own socket folder.
    code, left, err = _run(tmp_path, sig)
    assert left == ["mine.txt"], err
    if sig != signal.SIGINT:
        # Still ended by the signal, as without grainlike.
        assert code == -sig, (code, err)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_leaves_no_statistics_directory_behind(tmp_path, sig):
    # With execution statistics on, the workers report into a directory in TMPDIR.
    code, left, err = _run(tmp_path, sig, install='grain.config.update("py_debug_mode", True)')
    assert left == ["mine.txt"], err


def test_the_users_own_signal_handler_is_kept(tmp_path):
    code, left, err = _run(tmp_path, signal.SIGTERM, install=_USER_HANDLER)
    assert code == 3, err
    assert "handled.txt" in left
    assert [n for n in left if n.startswith("pymp-")] == [], left


def test_a_killed_process_group_leaves_nothing_behind(tmp_path):
    # The worker server dies with the program and removes nothing then: its
    # socket is in Linux's abstract namespace, which holds no file. (Where there
    # is none, tests/test_platforms.py covers the folder a later program removes.)
    from grainlike.workers import server

    assert server.abstract_sockets()
    code, left, err = _run(tmp_path, signal.SIGKILL, group=True)
    assert code == -signal.SIGKILL, (code, err)
    assert left == ["mine.txt"], err


_FORKED_CHILD_STUCK_IN_C = r"""
import ctypes, multiprocessing, signal
import grainlike as grain
from grainlike.dataset import MapDataset
from grainlike.workers import server

it = iter(MapDataset.range(100).to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=1)))
next(it)
assert signal.getsignal(signal.SIGTERM) is server.exit_on_signal  # installed for cleanup


def stuck():
    # A default pthread mutex locked twice by one thread waits forever in C,
    # where no Python signal handler can run: a lock another thread held at fork time.
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)


child = multiprocessing.get_context("fork").Process(target=stuck)
child.start()
child.join(1)
child.terminate()  # SIGTERM
child.join(20)
print("exitcode", child.exitcode, flush=True)
it.close()
"""


def test_a_forked_child_stuck_in_c_code_ends_on_sigterm(tmp_path):
    # The handler the parent installs is Python code: a child that inherited it and
    # is stuck in C would never run it, and Pool.terminate() would wait forever.
    script = tmp_path / "fork_child.py"
    script.write_text(_FORKED_CHILD_STUCK_IN_C)
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "JAX_PLATFORMS": "cpu"}
    proc, out, err = run_in_session([sys.executable, str(script)], timeout=90, env=env)
    assert proc.returncode == 0, err
    assert f"exitcode {-signal.SIGTERM}" in out, (out, err)


# numpy is imported before the Ctrl-C can come: a KeyboardInterrupt inside numpy's
# own C import (its PyCapsule_Import of datetime) turns into numpy's ImportError,
# which chains two tracebacks whatever the program imports numpy for.
_STARTING = r"""
import time
import numpy
print("importing", flush=True)
import grainlike as grain
from grainlike.dataset import MapDataset

def slow(x):
    time.sleep(0.01)
    return x

for x in MapDataset.range(10**6).map(slow).to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=2)):
    pass
"""


@pytest.mark.parametrize("delay", [0.05, 0.3, 1.0])
def test_ctrl_c_while_workers_start_prints_one_traceback(tmp_path, delay):
    # Ctrl-C in a terminal sends SIGINT to the whole foreground process group:
    # the worker server (booting, or forking workers) and the workers are in it
    # too. Only the program's own KeyboardInterrupt is printed.
    script = tmp_path / "starting.py"
    script.write_text(_STARTING)
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "JAX_PLATFORMS": "cpu"}
    with in_session([sys.executable, str(script)], env=env) as proc:
        assert proc.stdout.readline().strip() == "importing"
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(30)
        err = proc.stderr.read()
        assert leaks.wait_until(lambda: not leaks.session_processes(proc.pid), timeout=10), leaks.session_processes(proc.pid)
    assert err.count("Traceback") == 1, err
    assert err.rstrip().endswith("KeyboardInterrupt"), err


# The Ctrl-C comes at a chosen point of the first worker's fork: the process group
# gets it from an at-fork hook of the parent (the KeyboardInterrupt the parent raised
# there was printed as "Exception ignored" and lost, and the program waited for
# workers that had died of it) or of the child (which printed a traceback of its own).
_CTRL_C_IN_FORK = r"""
import os, signal, time
import numpy

def ctrl_c():
    try:  # Once, whichever process comes first.
        os.close(os.open(os.environ["CTRL_C_SENT"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os.killpg(0, signal.SIGINT)

os.register_at_fork(**{"after_in_" + os.environ["CTRL_C_IN"]: ctrl_c})
import grainlike as grain
from grainlike.dataset import MapDataset
from grainlike.workers import start

assert start.fork_is_safe()  # The workers fork from this process.
print("importing", flush=True)
for x in MapDataset.range(10**6).to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=2)):
    time.sleep(0.001)
"""


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="needs os.register_at_fork")
@pytest.mark.parametrize("side", ["parent", "child"])
def test_ctrl_c_while_a_worker_forks_prints_one_traceback_and_ends_the_program(tmp_path, side):
    script = tmp_path / "ctrl_c_in_fork.py"
    script.write_text(_CTRL_C_IN_FORK)
    env = {
        **os.environ, "PYTHONPATH": os.getcwd(), "JAX_PLATFORMS": "cpu",
        "CTRL_C_IN": side, "CTRL_C_SENT": str(tmp_path / "sent"),
    }
    with in_session([sys.executable, str(script)], env=env) as proc:
        assert proc.stdout.readline().strip() == "importing"
        proc.wait(60)
        err = proc.stderr.read()
        assert leaks.wait_until(lambda: not leaks.session_processes(proc.pid), timeout=10), leaks.session_processes(proc.pid)
    assert err.count("Traceback") == 1, err
    assert "Exception ignored" not in err, err
    assert err.rstrip().endswith("KeyboardInterrupt"), err
    assert proc.returncode != 0


def _signal_bits(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/status")
def test_the_worker_server_boots_with_ctrl_c_blocked_then_ignores_it():
    # A Ctrl-C during the server's interpreter start-up (before any of its code
    # runs) must stay pending, not print a "Fatal Python error" of its own: the
    # server is spawned with SIGINT blocked, and unblocks it once it ignores it.
    from multiprocessing import util

    from grainlike.workers import server

    r, w = os.pipe()
    script = f"import os; os.write({w}, open('/proc/self/status').read().encode()); os.close({w})"
    exe = sys.executable.encode()
    with server.sigint_held():
        pid = util.spawnv_passfds(exe, [exe, b"-c", script.encode()], [w])
    os.close(w)
    with os.fdopen(r) as f:
        status = f.read()
    os.waitpid(pid, 0)
    blocked = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigBlk:"))
    assert blocked & (1 << (signal.SIGINT - 1))
    # This process's mask is as it was.
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    # The running server: SIGINT ignored and no longer blocked.
    running = server.running_server()
    pid = running._forkserver_pid
    assert _signal_bits(pid, "SigIgn") & (1 << (signal.SIGINT - 1))
    assert not _signal_bits(pid, "SigBlk") & (1 << (signal.SIGINT - 1))
