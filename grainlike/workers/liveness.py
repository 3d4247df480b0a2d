"""Failure detection: whether a worker moves, what it was doing, how it ended.

Each worker records, in a page shared with the consumer (``Progress``), the last
time its main thread was seen somewhere new. A worker awaited for longer than
``stall_timeout_s`` without moving is reported (``WorkerStalledError``) with the
Python stack it dumps into a pipe on ``STACK_SIGNAL`` (``read_stack``).
"""

from __future__ import annotations

import mmap
import os
import select
import signal
import struct
import time
from typing import Any, Callable, Optional

from grainlike.core import memfd
from grainlike.core.errors import WorkerDiedError, WorkerStalledError
from grainlike.workers import server

# How often a consumer waiting for an output looks at liveness and close().
POLL_S = 0.5
# How long a stalled worker gets to write its stack.
_STACK_WAIT_S = 2.0
# ``MultiprocessingOptions.stall_timeout_s``'s default.
DEFAULT_STALL_TIMEOUT_S = 300.0
# The least time a worker still starting (no progress reported) gets, whatever the stall timeout.
STARTUP_TIMEOUT_S = 60.0
# The signal on which a worker dumps its threads' stacks.
STACK_SIGNAL = signal.SIGUSR1


def allowed_stall_s(stall_timeout_s: float, last_progress: float) -> float:
    """How long a worker whose last reported progress is ``last_progress`` (0.0: none yet) may not move."""
    return max(stall_timeout_s, STARTUP_TIMEOUT_S) if last_progress == 0.0 else stall_timeout_s


class Progress:
    """One float64 per worker, shared by the pool and its workers: last progress time.

    Times are ``time.monotonic()``, one clock for every process of a Linux machine.
    """

    _SLOT = struct.Struct("d")

    def __init__(self, worker_count: int):
        size = max(worker_count * self._SLOT.size, mmap.PAGESIZE)
        self.fd = memfd.new_fd(size, "grainlike-progress")
        try:
            self.mm = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.size = size

    def last(self, w: int) -> float:
        return self._SLOT.unpack_from(self.mm, w * self._SLOT.size)[0]

    def close_fd(self) -> None:
        """Every worker has its copy: the pool needs only its mapping."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def close(self) -> None:
        self.close_fd()
        self.mm.close()


def process_state(pid: int) -> str:
    """The state letter of ``/proc/<pid>/stat`` ("R", "S", "D", "T", ...); "" if unknown."""
    return (server.proc_stat(pid) or [""])[0]


def exited(proc: Any) -> bool:
    """Whether worker ``proc`` has exited, even if its parent (the worker server) has not reaped it yet."""
    if proc.exitcode is not None:
        return True
    state = process_state(proc.pid)
    return state in ("Z", "X") or (state == "" and not server.pid_alive(proc.pid))


def read_stack(pid: int, fd: int) -> str:
    """Asks worker ``pid`` for its threads' stacks and reads them from ``fd``."""
    try:
        os.kill(pid, STACK_SIGNAL)
    except OSError as e:
        return f"(could not ask for its stack: {e})"
    chunks = []
    deadline = time.monotonic() + _STACK_WAIT_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        # The dump comes line by line, and a loaded machine can pause the worker
        # between lines: only the deadline (or its exit) says it is complete.
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        data = os.read(fd, 1 << 16)
        if not data:
            break
        chunks.append(data)
    text = b"".join(chunks).decode("utf-8", "replace").rstrip()
    return text or f"(no answer to {STACK_SIGNAL.name} within {_STACK_WAIT_S:g} s)"


def describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "is not responding"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (SIGKILL is also what the out-of-memory killer sends)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {code}"


def died_error(proc: Any, w: int, worker_count: int, state: Any, then: str) -> WorkerDiedError:
    """The error for worker ``w`` (process ``proc``, at ``state``), whose pipe shows that it is gone."""
    proc.join(0.5)
    code = proc.exitcode
    who = f"grainlike worker {w} of {worker_count} (pid {proc.pid})"
    if code is not None and not server.exit_status_known(proc):
        head = f"{who} exited (its exit status is unknown: the worker server that started it has gone)"
    elif code is not None and code > 0:
        # grain's words first (its tests and users match them), e.g. after sys.exit(n).
        head = f"Worker process was terminated unexpectedly with exit code {code}: {who} exited"
    else:
        head = f"{who} {describe_exit(code)}"
    return WorkerDiedError(
        f"{head} before finishing its outputs "
        f"(its state after its last delivered output: {state!r}). {then}"
    )


def check_progress(
    sd: Any, w: int, worker_count: int, state: Any, stall_timeout_s: Optional[float], waiting_since: float,
    then: Callable[[], str],
) -> None:
    """Raises ``WorkerStalledError`` if worker ``w`` has not moved for the stall timeout.

    Only the time since the consumer began waiting counts: before that, the
    worker may rightly have been idle with its buffer full. A worker still
    starting gets at least ``STARTUP_TIMEOUT_S``. ``sd`` is the pool's
    ``shutdown.Shutdown``; ``then`` says what the pool does next (``WorkerPool._then``).
    """
    timeout = stall_timeout_s
    if timeout is None:
        return
    last = waiting_since
    if sd.progress is not None:
        reported = sd.progress.last(w)
        timeout = allowed_stall_s(timeout, reported)
        last = max(last, reported)
    if time.monotonic() - last < timeout:
        return
    pid = sd.procs[w].pid
    letter = process_state(pid)
    if letter in ("T", "t"):
        stack = (
            f"none: the process is stopped (state {letter}: SIGSTOP or SIGTSTP, or a "
            "debugger), and a stopped process cannot report its stack; `kill -CONT "
            f"{pid}` resumes it"
        )
    else:
        stack = "\n" + read_stack(pid, sd.stacks[w])
    raise WorkerStalledError(
        f"grainlike worker {w} of {worker_count} (pid {pid}) made no progress for "
        f"{timeout:g} s while its next output was awaited (its state after its last "
        f"delivered output: {state!r}). {then()} If a single step "
        "of the pipeline rightly takes that long, raise "
        "MultiprocessingOptions.stall_timeout_s (None turns the check off). The "
        f"worker's Python stack (where it is stuck): {stack}"
    )
