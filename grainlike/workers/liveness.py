"""Failure detection: whether a worker moves, what it was doing, how it ended.

Each worker counts its moves in a page shared with the consumer (``Progress``):
the count goes up whenever its main thread was seen somewhere new or it used
CPU time. The consumer times a worker with its own clock only
(``StallWatch``): a worker awaited for longer than ``stall_timeout_s`` during
which its count did not change is reported (``WorkerStalledError``) with the
Python stack it dumps into a pipe on ``STACK_SIGNAL`` (``read_stack``). Time
during which the consumer itself did not run (the whole job stopped with
SIGSTOP or Ctrl-Z, a debugger, the machine asleep) is not counted.
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
from grainlike.core.errors import ClosedIteratorError, ForeignWorkersError, WorkerDiedError, WorkerStalledError
from grainlike.workers import server
from grainlike.workers.worker_process import exit_status_known

# How often a consumer waiting for an output looks at liveness and close().
POLL_S = 0.5
# A look that comes this much later than POLL_S after the one before means the
# consumer did not run in between (stopped, suspended): that gap is not counted.
SUSPENDED_GAP_S = 1.0
# How long a stalled worker gets to write its stack.
_STACK_WAIT_S = 2.0
# ``MultiprocessingOptions.stall_timeout_s``'s default.
DEFAULT_STALL_TIMEOUT_S = 300.0
# The least time a worker still starting (no progress reported) gets, whatever the stall timeout.
STARTUP_TIMEOUT_S = 60.0
# The signal on which a worker dumps its threads' stacks.
STACK_SIGNAL = signal.SIGUSR1


def allowed_stall_s(stall_timeout_s: float, moves: float) -> float:
    """How long a worker that has reported ``moves`` moves (0: none yet, it is starting) may not move."""
    return max(stall_timeout_s, STARTUP_TIMEOUT_S) if not moves else stall_timeout_s


class Progress:
    """One uint64 per worker, shared by the pool and its workers: how many times the worker was seen moving.

    A count, never a time: the consumer measures how long a count stays the
    same with its own clock, so nothing a worker writes (or a transform does to
    the worker's clock) can make a stuck worker look alive for longer.
    """

    _SLOT = struct.Struct("Q")

    def __init__(self, worker_count: int):
        size = max(worker_count * self._SLOT.size, mmap.PAGESIZE)
        self.fd = memfd.new_fd(size, "grainlike-progress")
        try:
            self.mm = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.size = size

    def moves(self, w: int) -> int:
        return self._SLOT.unpack_from(self.mm, w * self._SLOT.size)[0]

    def close_fd(self) -> None:
        """Every worker has its copy: the pool needs only its mapping."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def close(self) -> None:
        self.close_fd()
        self.mm.close()


class StallWatch:
    """How long one worker has been awaited without moving, on the consumer's own clock.

    ``look()`` is called about every ``POLL_S`` while the consumer waits; the
    time between two looks counts unless it is longer than ``POLL_S +
    SUSPENDED_GAP_S``, which means this process did not run meanwhile: then the
    worker, stopped or asleep with it, is not blamed for it. A change of the
    worker's move count starts the count again.
    """

    def __init__(self, progress: Optional[Progress], w: int):
        self._progress = progress
        self._w = w
        self.moves = 0 if progress is None else progress.moves(w)
        self._last = time.monotonic()
        self.still_s = 0.0

    def look(self) -> float:
        """The seconds counted since the worker last moved (or since the wait began)."""
        now = time.monotonic()
        gap, self._last = now - self._last, now
        if gap <= POLL_S + SUSPENDED_GAP_S:
            self.still_s += gap
        if self._progress is not None:
            moves = self._progress.moves(self._w)
            if moves != self.moves:
                self.moves = moves
                self.still_s = 0.0
        return self.still_s


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
    if code is not None and not exit_status_known(proc):
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


def exit_error(pid: int, w: int, worker_count: int, state: Any, msg: tuple, then: str) -> WorkerDiedError:
    """The error for worker ``w``'s ``EXIT`` report: the user's code ended it (``guards.exit_report``)."""
    _, _, code, what, where, notes, stack = msg
    who = f"grainlike worker {w} of {worker_count} (pid {pid})"
    if what.startswith(("sys.exit", "os._exit")):
        head = f"Worker process was terminated unexpectedly with exit code {code}: {who} ended: {what}"
    else:
        head = f"{who} ended: {what} was raised"
    about = "".join(f" {note}" if note.endswith(".") else f" {note}." for note in notes)
    return WorkerDiedError(
        f"{head} in {where}, in the user's code computing its next output (its state after "
        f"its last delivered output: {state!r}, where a restore retries).{about} {then}"
        f"\nThe worker's stack:\n{stack}"
    )


def check_progress(
    sd: Any, w: int, worker_count: int, state: Any, stall_timeout_s: Optional[float], watch: StallWatch,
    then: Callable[[], str],
) -> None:
    """Raises ``WorkerStalledError`` if worker ``w`` has not moved for the stall timeout (``watch``'s count).

    Only the time since the consumer began waiting counts: before that, the
    worker may rightly have been idle with its buffer full. A worker still
    starting gets at least ``STARTUP_TIMEOUT_S``. ``sd`` is the pool's
    ``shutdown.Shutdown``; ``then`` says what the pool does next (``WorkerPool._then``).
    """
    timeout = stall_timeout_s
    if timeout is None:
        return
    still = watch.look()
    if sd.progress is not None:
        timeout = allowed_stall_s(timeout, watch.moves)
    if still < timeout:
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


def after_failure(error_ends_worker: bool) -> str:
    """What happens to a worker pool after a worker failed, for its error messages."""
    if error_ends_worker:
        return (
            "Every later next() raises too, rather than end the iteration without "
            "the rest of its outputs; get_state() is the state after the last "
            "delivered output: restore a new iterator from it (set_state) to go on "
            "with nothing skipped or repeated."
        )
    return (
        "The other workers were stopped; call next() again to restart the "
        "workers from the last delivered output, or set_state() a checkpoint."
    )


def closed_error(w: int, worker_count: int) -> ClosedIteratorError:
    """The error of a ``next()`` that waited for worker ``w`` while its pool was closed."""
    return ClosedIteratorError(
        "the worker pool was closed (by close(), before this call or from another "
        "thread during it, or at exit) "
        f"while next() waited for worker {w} of {worker_count}; the iterator keeps the "
        "state of its last delivered output"
    )


def foreign_error(pids: list, owner: int) -> ForeignWorkersError:
    """The error for a fork of process ``owner`` that uses its workers ``pids``."""
    return ForeignWorkersError(
        f"this iterator's worker processes (pids {pids}) belong to process "
        f"{owner}; process {os.getpid()} is a fork of it (os.fork(), or a "
        "multiprocessing Process with the 'fork' start method) and cannot use "
        "them. In the child, create a new iterator (iter(loader) or iter(dataset), "
        "then set_state() to continue from a position): it starts workers of its own."
    )


def malformed_error(pid: int, w: int, worker_count: int, error: BaseException) -> RuntimeError:
    """The error for a message of worker ``w`` that does not parse (``frames.Malformed``)."""
    return RuntimeError(
        f"grainlike worker {w} of {worker_count} (pid {pid}) sent a malformed output "
        f"message ({error}); nothing of it was delivered"
    )
