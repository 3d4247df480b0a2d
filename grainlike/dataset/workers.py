"""The worker pool: processes that each compute one worker's share of a task.

A task is any picklable object with the ``WorkerTask`` methods. Worker ``w`` of
``W`` starts at a state (JSON-able: an int, a dict of indices) and yields
``(state after this output, output)``; the pool takes the workers' outputs
strictly round-robin and keeps every worker's state after its last delivered
output, which is all a checkpoint needs. ``mp_prefetch`` is the task (states are
dataset iterator states), for the Dataset API and the DataLoader alike.

Workers fork from the calling process while that is safe (``fork_is_safe``: no
other thread, no JAX backend), as torch's do; otherwise from the worker server
(``worker_server``), booted when grainlike is imported, so a worker starts in
milliseconds either way and never re-runs the user's ``__main__``. Where
there is no server (``worker_server.server_supported``: no ``os.fork``, or
macOS) workers are spawned, each a fresh interpreter that does not re-run
``__main__`` either (docs/platforms.md: its start cost). The task
travels as cloudpickle bytes, so lambdas and classes defined in a notebook or an
unguarded script work. Batch leaves come back through shared memory (``shm``).

Liveness: each worker records, in a page of memory shared with the consumer, the
last time its main thread was seen somewhere new. A worker awaited for longer
than ``stall_timeout_s`` without moving is reported (``WorkerStalledError``) with
its Python stack, which the worker dumps (``faulthandler``) into a pipe when the
consumer sends it ``SIGUSR1``. Nothing the consumer does waits on a worker
without a bound, so ``close()`` from another thread ends a blocked ``next()``.
"""

from __future__ import annotations

import atexit
import collections
import functools
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import mmap
import os
import select
import pickle
import signal
import struct
import sys
import threading
import time
import weakref
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence

import cloudpickle

from grainlike.core import memfd
from grainlike.core.errors import (  # noqa: F401  (the worker errors' public home was this module)
    ClosedIteratorError,
    ForeignWorkersError,
    WorkerDiedError,
    WorkerError,
    WorkerStalledError,
    _WorkerFailed,
    add_note,
    traceback_from_frames,
)
from grainlike.core.tree import Allocator
from grainlike.dataset import shm, worker_server
from grainlike.dataset.options import MultiprocessingOptions
from grainlike.dataset.worker_protocol import END, ERR, OUT, OUTS, READY, RESET, RESET_DONE, START, STOP, TICK

# How long close() waits for the workers to exit by themselves before terminating
# them; and when the pool's owner was dropped (nothing will read what they compute).
_JOIN_TIMEOUT_S = 2.0
_DROPPED_JOIN_TIMEOUT_S = 0.1
# How often a consumer waiting for an output looks at liveness and close().
_POLL_S = 0.5
# How long a stalled worker gets to write its stack.
_STACK_WAIT_S = 2.0
DEFAULT_STALL_TIMEOUT_S = MultiprocessingOptions.stall_timeout_s
# The least time a worker that has not reported any progress yet (it is still
# starting) is given before it counts as stalled, whatever the stall timeout.
STARTUP_TIMEOUT_S = 60.0
# The signal on which a worker dumps its threads' stacks.
STACK_SIGNAL = signal.SIGUSR1


def allowed_stall_s(stall_timeout_s: float, last_progress: float) -> float:
    """How long a worker whose last reported progress is ``last_progress`` may not move.

    The progress page starts zeroed: 0.0 means the worker has not reported since
    its process began, so it is still starting and gets ``STARTUP_TIMEOUT_S`` at least.
    """
    return max(stall_timeout_s, STARTUP_TIMEOUT_S) if last_progress == 0.0 else stall_timeout_s


class PassedFd:
    """A file descriptor handed to a worker as it starts (duplicated into it).

    Pickle it only as part of a worker's start arguments; in the worker it turns
    into the plain int of its own copy.
    """

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction

        return (_detach_fd, (reduction.DupFd(self.fd),))


def _detach_fd(dup: Any) -> int:
    return dup.detach()


class _Progress:
    """One float64 per worker, shared by the pool and its workers: last progress time.

    Times are ``time.monotonic()``, which on Linux is one clock for every
    process of the machine.
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


def _process_state(pid: int) -> str:
    """The state letter of ``/proc/<pid>/stat`` ("R", "S", "D", "T", ...); "" if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode("ascii", "replace")
        return data.rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _exited(proc: Any) -> bool:
    """Whether worker ``proc`` has exited, even if its parent (the worker server) has not reaped it yet."""
    if proc.exitcode is not None:
        return True
    state = _process_state(proc.pid)
    return state in ("Z", "X") or (state == "" and not shm.pid_alive(proc.pid))


def _read_stack(pid: int, fd: int) -> str:
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
        # faulthandler writes the dump line by line from a signal handler, and a
        # loaded machine can pause the worker between two lines: only the
        # deadline (or the worker's exit) says the dump is complete.
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        data = os.read(fd, 1 << 16)
        if not data:
            break
        chunks.append(data)
    text = b"".join(chunks).decode("utf-8", "replace").rstrip()
    return text or f"(no answer to {STACK_SIGNAL.name} within {_STACK_WAIT_S:g} s)"


class WorkerTask(Protocol):
    """The work a pool runs: picklable, and the same in every worker.

    Example:
      >>> class Squares:
      ...     def outputs(self, worker_index, worker_count, state, alloc):
      ...         for i in range(state, 6)[worker_index::worker_count]:
      ...             yield i + 1, i * i
      ...     def end_state(self, worker_index, worker_count, state):
      ...         return state
      ...     def pickling_error(self, error):
      ...         return error
      >>> with WorkerPool(Squares(), 2, [0, 0]) as pool:
      ...     list(pool)
      [0, 1, 4, 9, 16, 25]
    """

    def outputs(
        self, worker_index: int, worker_count: int, state: Any, alloc: Optional[Allocator]
    ) -> Iterator[tuple[Any, Any]]:
        """Yields ``(state after this output, output)`` for one worker.

        Args:
          worker_index: this worker, in ``[0, worker_count)``.
          worker_count: number of workers.
          state: where to start: what the pool was given for this worker, or the
            state after an output this method yielded.
          alloc: allocates stacked batch leaves (in shared memory, in a worker);
            None in the calling process.
        """

    def end_state(self, worker_index: int, worker_count: int, state: Any) -> Any:
        """The worker's state once ``outputs`` is exhausted (``state``: after its last output)."""

    def pickling_error(self, error: Exception) -> BaseException:
        """The exception to raise when ``cloudpickle`` fails on the task with ``error``."""

    # Optional: ``describe_output(worker_index, worker_count, state_before,
    # state_after) -> str``, a sentence naming the records and the transform an
    # output came from, for the error raised when the output cannot be pickled.


def _jax_backend_initialised() -> bool:
    """Whether JAX has started a backend (its runtime threads) in this process."""
    xla_bridge = sys.modules.get("jax._src.xla_bridge")
    if xla_bridge is None:
        return False
    backends = getattr(xla_bridge, "_backends", None)
    # A JAX that keeps its backends elsewhere: assume they may be running.
    return not isinstance(backends, dict) or bool(backends)


# The modules whose threads a fork may leave behind: a Jupyter (IPython) kernel's
# own threads (its sockets' pollers, heartbeat, history writer, output
# watchers) wait on sockets and pipes and hold no lock a worker takes; ipykernel
# itself supports forked children, routing their output back over a pipe of its
# own. Without them no notebook could fork its workers.
_FORK_TOLERANT = ("ipykernel.", "IPython.")


def _fork_tolerant(thread: threading.Thread) -> bool:
    """Whether ``thread`` belongs to a Jupyter kernel (by its class, or its target's owner)."""
    owner = type(thread).__module__
    target = getattr(thread, "_target", None)  # a plain Thread running a kernel's method
    if target is not None:
        bound = getattr(target, "__self__", None)
        owner = type(bound).__module__ if bound is not None else getattr(target, "__module__", owner) or owner
    return owner.startswith(_FORK_TOLERANT)


def fork_is_safe() -> bool:
    """Whether workers may be forked from this process directly, as torch does.

    Forking copies only the calling thread: a lock another thread holds (in
    logging, in an allocator, in JAX's runtime) stays locked forever in the
    child. So this process must run no other thread (Python or native) than
    those it ran when grainlike was imported (numpy's BLAS pool, a Jupyter
    kernel's own threads: ``_FORK_TOLERANT``), and no JAX backend (importing
    jax starts none; its first computation does). Then a fork is what the
    worker server would do, minus the round trip (W4: the first batch with 2
    workers in a fresh process; W4k in a notebook). Otherwise workers fork from
    the worker server, which never has either.
    """
    from grainlike.dataset.base import THREADS_AT_IMPORT, native_thread_count

    if sys.platform != "linux" or not hasattr(os, "fork"):
        return False
    if _jax_backend_initialised():
        return False
    current = threading.current_thread()
    if any(t is not current and not _fork_tolerant(t) for t in threading.enumerate()):
        return False
    # Native threads too (an ArrayRecord reader's pool, OpenCV's): a forked
    # child reading ArrayRecord with its parent's pool copied crashes.
    return 0 < native_thread_count() <= THREADS_AT_IMPORT


class _ForkedWorkerProcess(multiprocessing.context.ForkProcess):
    """A worker forked from the calling process (``fork_is_safe()``)."""


def _forked_entry(parent_ends: list, *args) -> None:
    # The child's copies of the consumer's ends of its own pipes: only the
    # consumer may hold them, so that each side sees EOF when the other exits.
    # (The ends of earlier workers were closed by _after_fork_in_child.)
    for fd in parent_ends:
        try:
            os.close(fd)
        except OSError:
            pass
    _worker_entry(*args)


def _as_inherited(arg: Any) -> Any:
    """A start argument for a forked worker: a ``PassedFd`` is inherited as it is."""
    if isinstance(arg, PassedFd):
        return arg.fd
    if isinstance(arg, tuple):
        return tuple(_as_inherited(a) for a in arg)
    if isinstance(arg, dict):
        return {k: _as_inherited(v) for k, v in arg.items()}
    return arg


def prestart() -> None:
    """Starts the forkserver now so the first workers fork at once.

    Called when a loader with workers is built: booting the server (a fresh
    interpreter importing numpy and grainlike) then overlaps whatever the program
    does before its first ``next()``. Later pools in the process reuse it. The
    server imports the main module only if the user preloads ``"__main__"``.
    Not while workers would fork from this process directly (``fork_is_safe``).
    """
    if fork_is_safe() or not worker_server.server_supported():
        return
    try:
        worker_server.running_server()
    except Exception:
        pass  # Starting workers later reports the problem with its context.


def pickle_task(task: WorkerTask) -> tuple[bytes, dict]:
    """cloudpickle bytes of the task, or the task's own error naming what fails.

    Returns:
      ``(bytes, shipped)``: ``shipped`` maps tokens to descriptors of the
      anonymous memory the task refers to (an ``InMemoryDataSource``'s data),
      which every worker receives with the bytes; the caller closes them.
    """
    with memfd.shipping() as shipped:
        try:
            return cloudpickle.dumps(task), shipped
        except Exception as e:
            raise task.pickling_error(e) from e


def _describe_exit(code: Optional[int]) -> str:
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


def _ask_to_stop(control: Any) -> None:
    try:
        control.send((STOP,))
    except Exception:
        pass  # Already gone.


def _force_exit(proc: Any) -> None:
    """Terminates, then kills, a worker that did not exit when asked to."""
    if proc.exitcode is None:
        proc.terminate()
        try:
            os.kill(proc.pid, signal.SIGCONT)  # A stopped worker acts on SIGTERM only once resumed.
        except OSError:
            pass
        proc.join(1.0)
    if proc.exitcode is None:
        proc.kill()
        proc.join(1.0)


def _stop_process(proc: Any, control: Any, ask: bool = True) -> None:
    """Asks one worker to stop (unless ``ask`` is False: it cannot act on it), then makes it."""
    if ask:
        _ask_to_stop(control)
        proc.join(_JOIN_TIMEOUT_S)
    _force_exit(proc)


class _Shutdown:
    """Everything a pool must release; callable once, from close(), GC or exit."""

    def __init__(self):
        self.procs: list = []
        self.controls: list = []
        self.results: list = []
        self.readers: list = []
        # Read ends of the pipes each worker writes its stacks to.
        self.stacks: list = []
        self.progress: Optional[_Progress] = None
        # Descriptors of the memory the task refers to, until every worker has its copy.
        self.shipped: dict = {}
        self.done = False
        self.lock = threading.Lock()
        # Only this process may stop the workers: a forked child has copies of
        # this object, and its exit must leave its parent's workers alone.
        self.owner_pid = os.getpid()
        # Set when workers are started from a background thread (warm start).
        self.launcher: Optional[threading.Thread] = None
        self.launched = 0
        self.launch_error: Optional[BaseException] = None

    def __call__(self, join_timeout_s: float = _JOIN_TIMEOUT_S) -> None:
        memfd.close_all(self.shipped)  # A forked child closes its own copies too.
        if os.getpid() != self.owner_pid:
            return
        with self.lock:
            if self.done:
                return
            self.done = True
        launcher = self.launcher
        if launcher is not None and launcher is not threading.current_thread():
            launcher.join()  # At most one more worker start; then it sees done.
        # All are asked first, so that they exit together, within one timeout.
        for conn in self.controls:
            _ask_to_stop(conn)
        deadline = time.monotonic() + join_timeout_s
        for p in self.procs:
            p.join(max(deadline - time.monotonic(), 0.0))
        for p in self.procs:
            _force_exit(p)
        self.close_ends()
        for reader in self.readers:
            reader.close()
        if self.progress is not None:
            self.progress.close()

    def close_ends(self) -> None:
        """Closes this process's ends of the workers' pipes and sockets."""
        for conn in self.controls + self.results:
            try:
                conn.close()
            except Exception:
                pass
        stacks, self.stacks = self.stacks, []
        for fd in stacks:
            try:
                os.close(fd)
            except OSError:
                pass
        for p in self.procs:
            try:
                p.close()
            except Exception:
                pass


_live: "weakref.WeakSet[WorkerPool]" = weakref.WeakSet()


@atexit.register
def _close_all_at_exit() -> None:
    for pool in list(_live):
        if pool._shutdown.owner_pid == os.getpid():
            pool.close()


# Also on SIGTERM / SIGHUP (worker_server.install_exit_on_signals).
worker_server.exit_cleanups.append(_close_all_at_exit)


def _after_fork_in_child() -> None:
    """Makes a forked child independent of its parent's workers.

    The child keeps copies of the parent's pools (using one raises
    ``ForeignWorkersError``); here it drops what would let it touch the parent's
    workers: its copies of their pipes, and multiprocessing's record of them as
    children (whose exit handler would terminate them). The worker server is
    forgotten too (``worker_server``), so the child starts workers of its own.
    """
    from multiprocessing import process

    for pool in list(_live):
        sd = pool._shutdown
        sd.close_ends()
        for proc in sd.procs:
            process._children.discard(proc)
    _live.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class WorkerPool:
    """Outputs of ``worker_count`` worker processes, taken strictly round-robin.

    ``states[w]`` is worker ``w``'s state after its last delivered output (at
    first, where it starts) and ``next_worker`` whose turn is next; both change
    only when an output is returned, so they are a checkpoint at every step.

    Reset: ``reset()`` moves running workers to new states in the same
    processes (grain's ``set_state`` keeps its processes too); each drops what
    it computed ahead and goes on from its new state (``worker_protocol``'s
    ``RESET``).

    Warm start: when ``next()`` has to start the workers (rather than
    ``start()`` ahead of time) and ``warm_start`` is set, each worker is started
    held. Until worker ``w`` reports that it has loaded its task, the calling
    process computes ``w``'s outputs itself, with the same code from the same
    state; then it tells ``w`` where to go on. The outputs and states are those
    of the workers alone.

    Args:
      task: the work (see ``WorkerTask``).
      worker_count: number of worker processes (> 0).
      states: where each worker starts.
      next_worker: whose output comes first.
      exhausted: workers that have no more outputs (they are not started).
      buffer_size: finished outputs each worker keeps ready.
      profile: each worker logs its timings when it stops.
      warm_start: see above.
      error_ends_worker: an error raised in worker ``w`` ends ``w`` only: the
        error is raised once, and from then on ``w`` counts as exhausted at its
        last delivered state while the others go on (grain's ``mp_prefetch``).
        ``w``'s death (or stall) is raised by every later ``next()`` as well,
        since the rest of its outputs are lost (grain ends the iteration short
        there); ``states`` stay those of the last delivered output. Otherwise
        every error stops all workers and the pool is ``broken``; its owner
        starts a new one from ``states`` (the DataLoader).
      stall_timeout_s: a worker awaited for this long without making progress
        raises ``WorkerStalledError`` (see the module doc); None or 0: never.
    """

    def __init__(
        self,
        task: WorkerTask,
        worker_count: int,
        states: Sequence[Any],
        next_worker: int = 0,
        *,
        exhausted: Optional[Sequence[bool]] = None,
        buffer_size: int = 1,
        profile: bool = False,
        warm_start: bool = False,
        error_ends_worker: bool = False,
        stall_timeout_s: Optional[float] = DEFAULT_STALL_TIMEOUT_S,
    ):
        if worker_count < 1:
            raise ValueError(f"a worker pool needs worker_count >= 1, got {worker_count}")
        if len(states) != worker_count:
            raise ValueError(f"expected {worker_count} worker states, got {len(states)}")
        self._task = task
        self._w = worker_count
        self.states = list(states)
        self.next_worker = next_worker
        self.exhausted = [False] * worker_count if exhausted is None else [bool(e) for e in exhausted]
        self._buffer_size = max(int(buffer_size), 1)
        self._profile = bool(profile)
        self._warm_start = bool(warm_start)
        self._error_ends_worker = bool(error_ends_worker)
        self._stall_timeout_s = float(stall_timeout_s) if stall_timeout_s else None
        # Workers whose error was raised: they end at their next turn.
        self._failed = [False] * worker_count
        # With error_ends_worker: the worker that died (or stalled and was
        # stopped), and its error. The rest of its outputs cannot be computed
        # here, so from then on every next() raises rather than end the
        # iteration short.
        self._dead: Optional[tuple[int, BaseException]] = None
        # For delivered() from other threads: odd while a next() runs, and the
        # position it started from (the state after the last delivered output).
        self._calls = 0
        self._call_start: tuple = ()
        self._payload, shipped = pickle_task(task)
        self._started = False
        self._released = [collections.deque() for _ in range(worker_count)]
        # Outputs that came in one message with others ("outs"), not yet returned:
        # (state, payload) per output, per worker.
        self._inbox = [collections.deque() for _ in range(worker_count)]
        # Per worker, the number of the reset (see reset()) whose RESET_DONE is
        # still to come: its messages until then are stale. None: none pending.
        self._resetting: list = [None] * worker_count
        self._resets = 0
        # Workers started held, and the in-process outputs standing in for them.
        self._held = [False] * worker_count
        self._local: dict = {}
        self._shutdown = _Shutdown()
        self._shutdown.shipped = shipped
        self._finalizer = weakref.finalize(self, self._shutdown)
        self._closed = False

    @property
    def broken(self) -> bool:
        """Whether the pool stopped (closed, or after an error that stops every worker)."""
        return self._closed

    @property
    def pids(self) -> list:
        """Process ids of the workers started so far."""
        return [p.pid for p in self._shutdown.procs]

    def __iter__(self) -> "WorkerPool":
        return self

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, hold: bool = False) -> None:
        """Starts the workers; ``hold`` starts them held (see the class doc).

        Held workers are started from a background thread: starting the first
        workers of a process waits for the forkserver to boot, and the calling
        process has outputs to compute meanwhile.
        """
        self._check_owner()
        if self._started:
            return
        if self._closed:
            raise RuntimeError("the worker pool is closed")
        self._started = True
        self._shutdown.owner_pid = os.getpid()
        shm.raise_fd_limit()
        sd = self._shutdown
        if memfd.available():
            sd.progress = _Progress(self._w)
        _live.add(self)
        worker_server.install_exit_on_signals()
        self._held = [hold and not e for e in self.exhausted]
        launch = functools.partial(
            _launch,
            sd,
            self._payload,
            self._w,
            list(self.states),
            list(self.exhausted),
            self._buffer_size,
            self._profile,
            hold,
            [released.append for released in self._released],
        )
        if hold:
            sd.launcher = threading.Thread(target=launch, name="grainlike-start", daemon=True)
            sd.launcher.start()
        else:
            launch()

    def _then(self) -> str:
        """What happens to the pool after a worker failed."""
        if self._error_ends_worker:
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

    def _closed_error(self, w: int) -> ClosedIteratorError:
        return ClosedIteratorError(
            "the worker pool was closed (by close(), before this call or from another "
            "thread during it, or at exit) "
            f"while next() waited for worker {w} of {self._w}; the iterator keeps the "
            "state of its last delivered output"
        )

    def _recv(self, w: int, read: Optional[Callable[[Any], Any]] = None) -> Any:
        """Worker ``w``'s next message (or ``read(connection)`` once it is readable).

        Waits with a bound on each step: for ``close()`` from another thread, the
        worker's exit, and its progress.
        """
        sd = self._shutdown
        conn, proc = sd.results[w], sd.procs[w]
        waiting_since = time.monotonic()
        while True:
            if self._closed:
                raise self._closed_error(w)
            try:
                ready = multiprocessing.connection.wait([conn, proc.sentinel], timeout=_POLL_S)
                if not ready:
                    self._check_progress(w, waiting_since)
                    continue
                if conn in ready or conn.poll():
                    try:
                        return conn.recv() if read is None else read(conn)
                    except EOFError:
                        pass  # The worker is gone; report how.
                error = self._died_error(w)
            except (OSError, ValueError, IndexError):
                # close() in another thread closed the pipes or the process handle.
                if self._closed:
                    raise self._closed_error(w) from None
                raise
            raise error

    def _died_error(self, w: int) -> WorkerDiedError:
        """The error for worker ``w``, whose pipe shows that its process is gone."""
        proc = self._shutdown.procs[w]
        proc.join(0.5)
        code = proc.exitcode
        who = f"grainlike worker {w} of {self._w} (pid {proc.pid})"
        if code is not None and code > 0:
            # grain's words first (its tests and users match them), e.g. after sys.exit(n).
            head = f"Worker process was terminated unexpectedly with exit code {code}: {who} exited"
        else:
            head = f"{who} {_describe_exit(code)}"
        return WorkerDiedError(
            f"{head} before finishing its outputs "
            f"(its state after its last delivered output: {self.states[w]!r}). {self._then()}"
        )

    def _check_progress(self, w: int, waiting_since: float) -> None:
        """Raises ``WorkerStalledError`` if worker ``w`` has not moved for the stall timeout.

        Only the time since the consumer began waiting counts: before that, the
        worker may rightly have been idle with its buffer full. A worker that has
        not reported yet is still starting (a fresh interpreter, imports, the
        pipeline unpickled), which on a loaded host can rightly take longer than a
        short stall timeout: it gets at least ``STARTUP_TIMEOUT_S``.
        """
        timeout = self._stall_timeout_s
        if timeout is None:
            return
        sd = self._shutdown
        last = waiting_since
        if sd.progress is not None:
            reported = sd.progress.last(w)
            timeout = allowed_stall_s(timeout, reported)
            last = max(last, reported)
        if time.monotonic() - last < timeout:
            return
        pid = sd.procs[w].pid
        state = _process_state(pid)
        if state in ("T", "t"):
            stack = (
                f"none: the process is stopped (state {state}: SIGSTOP or SIGTSTP, or a "
                "debugger), and a stopped process cannot report its stack; `kill -CONT "
                f"{pid}` resumes it"
            )
        else:
            stack = "\n" + _read_stack(pid, sd.stacks[w])
        raise WorkerStalledError(
            f"grainlike worker {w} of {self._w} (pid {pid}) made no progress for "
            f"{timeout:g} s while its next output was awaited (its state after its last "
            f"delivered output: {self.states[w]!r}). {self._then()} If a single step "
            "of the pipeline rightly takes that long, raise "
            "MultiprocessingOptions.stall_timeout_s (None turns the check off). The "
            f"worker's Python stack (where it is stuck): {stack}"
        )

    def _tick(self, w: int) -> None:
        released = self._released[w]
        ids = []
        while released:
            ids.append(released.popleft())
        try:
            self._shutdown.controls[w].send((TICK, ids))
        except (OSError, ValueError):
            pass

    def _check_owner(self) -> None:
        owner = self._shutdown.owner_pid
        if self._started and owner != os.getpid():
            raise ForeignWorkersError(
                f"this iterator's worker processes (pids {self.pids}) belong to process "
                f"{owner}; process {os.getpid()} is a fork of it (os.fork(), or a "
                "multiprocessing Process with the 'fork' start method) and cannot use "
                "them. In the child, create a new iterator (iter(loader) or iter(dataset), "
                "then set_state() to continue from a position): it starts workers of its own."
            )

    def delivered(self) -> tuple[list, int, list]:
        """``(states, next_worker, exhausted)`` after the last delivered output, from any thread.

        Does not wait for a ``next()`` running in another thread (which may be
        blocked on a worker): while one runs, the position it started from is
        returned. Calls of ``next()`` itself must not overlap (their owner
        serialises them).
        """
        while True:
            calls = self._calls
            if calls % 2:
                states, next_worker, exhausted = self._call_start
            else:
                states, next_worker, exhausted = self.states, self.next_worker, self.exhausted
            position = (list(states), next_worker, list(exhausted))
            if self._calls == calls:
                return position

    def __next__(self) -> Any:
        self._check_owner()
        before = (list(self.states), self.next_worker, list(self.exhausted))
        self._call_start = before
        self._calls += 1
        try:
            self.start(hold=self._warm_start)
            return self._next_output()
        except StopIteration:
            raise
        except _WorkerFailed as failed:
            raise failed.error from None
        except BaseException:
            if not self._closed:
                # Interrupted (Ctrl-C, or any exception) half way: a message may be
                # half read, or taken but not returned. Stop the workers; the
                # owner restarts them from the last output actually returned.
                self.states, self.next_worker, self.exhausted = before
                self.close()
            raise
        finally:
            self._calls += 1

    def _advance(self, w: int) -> None:
        self.next_worker = (w + 1) % self._w

    def _dead_error(self) -> BaseException:
        """The error every ``next()`` raises once a worker died (with ``error_ends_worker``)."""
        w, error = self._dead
        pid = self._shutdown.procs[w].pid
        return type(error)(
            f"this iterator cannot go on without the remaining outputs of grainlike worker "
            f"{w} of {self._w} (pid {pid}), as raised before: {error}"
        )

    def _next_output(self) -> Any:
        while True:
            if self._dead is not None:
                raise _WorkerFailed(self._dead_error())
            if all(self.exhausted):
                raise StopIteration
            if self._local or any(self._held):
                self._release_ready()
            w = self.next_worker
            if self._failed[w]:
                # As grain: after its error a worker counts as exhausted, at the
                # state of its last delivered output.
                self._failed[w] = False
                self.exhausted[w] = True
            if self.exhausted[w]:
                self._advance(w)
                continue
            if self._held[w]:
                found, output = self._local_output(w)
                if found:
                    return output
                continue
            if self._resetting[w] is not None:
                self._drain_stale(w)
                continue
            inbox = self._inbox[w]
            if inbox:
                state, output = pickle.loads(inbox[0])
                inbox.popleft()
                self.states[w] = state
                self._advance(w)
                return output
            msg = self._message(w)
            kind = msg[0]
            if kind == OUT:
                output = self._shutdown.readers[w].materialize(msg[2])
                self.states[w] = msg[1]
                self._advance(w)
                self._tick(w)
                return output
            if kind == OUTS:
                # Small outputs travel several to a message, each pickled on its
                # own (worker_main._Outbox): one message, one credit.
                inbox.extend(msg[1])
                self._tick(w)
                continue
            if kind == END:
                self.exhausted[w] = True
                self.states[w] = msg[1]
                self._advance(w)
                continue
            if kind == ERR:
                raise self._failure(w, _rebuild_error(w, self._shutdown.procs[w].pid, msg))
            raise RuntimeError(f"unexpected message from worker {w}: {kind!r}")

    def _message(self, w: int) -> tuple:
        """Worker ``w``'s next message, with the descriptors of an ``OUT``'s new segments mapped."""
        try:
            msg = self._recv(w)
            if msg[0] == OUT and msg[3]:
                # New segments: their descriptors follow the message.
                fds = self._recv(w, functools.partial(shm.recv_fds, count=len(msg[3])))
                self._shutdown.readers[w].add(msg[3], fds)
        except WorkerDiedError as e:
            raise self._failure(w, e) from None
        except WorkerStalledError as e:
            raise self._failure(w, e, responsive=False) from None
        return msg

    def _drain_stale(self, w: int) -> None:
        """Drops worker ``w``'s messages from before its latest reset, up to its ``RESET_DONE``.

        They were computed from the state before ``reset()``: outputs are
        dropped (their segments go back to the worker, and each message's
        credit too, as if delivered), an end or an error is ignored (the worker
        starts again from the reset's state). A death or stall meanwhile is
        reported as at any other time.
        """
        while self._resetting[w] is not None:
            msg = self._message(w)
            kind = msg[0]
            if kind == OUT:
                # Mapped and let go at once: the segments are released as the
                # arrays of an output the user dropped.
                self._shutdown.readers[w].materialize(msg[2])
                self._tick(w)
            elif kind == OUTS:
                self._tick(w)
            elif kind == RESET_DONE and msg[1] == self._resetting[w]:
                self._resetting[w] = None

    def reset(self, states: Sequence[Any], next_worker: int, exhausted: Sequence[bool]) -> bool:
        """Moves the running workers to new states without restarting them (grain's set_state).

        Each worker is sent ``RESET`` with its state; what it computed before is
        dropped as it arrives (``_drain_stale``, at that worker's next turn), so
        the outputs from here on are those of workers started at ``states``,
        from the same processes. An exhausted worker idles until a later reset.

        Returns:
          True if the workers were reset; False where they cannot be (not
          started, closed, a worker that failed, died or is still starting or
          held): the pool is then unchanged (closed, if a worker's pipe broke
          during the reset) and the caller starts a new one from ``states``.
        """
        self._check_owner()
        sd = self._shutdown
        if (
            not self._started
            or self._closed
            or self._dead is not None
            or any(self._failed)
            or any(self._held)
            or self._local
            or sd.launch_error is not None
            or sd.launched != self._w
            or any(_exited(p) for p in sd.procs)
        ):
            return False
        if len(states) != self._w or len(exhausted) != self._w:
            raise ValueError(
                f"expected {self._w} worker states and exhausted flags, got {len(states)} and {len(exhausted)}"
            )
        self._resets += 1
        position = (list(states), next_worker, [bool(e) for e in exhausted])
        # delivered() from another thread sees the new position throughout.
        self._call_start = position
        self._calls += 1
        try:
            for w in range(self._w):
                try:
                    sd.controls[w].send((RESET, self._resets, position[0][w], position[2][w]))
                except (OSError, ValueError):
                    # The worker died meanwhile: the caller starts new workers from
                    # the new states (as before a reset).
                    self.close()
                    return False
                self._resetting[w] = self._resets
                self._inbox[w].clear()
            self.states, self.next_worker, self.exhausted = position
        finally:
            self._calls += 1
        return True

    def _failure(self, w: int, error: BaseException, responsive: bool = True) -> BaseException:
        """What to raise for worker ``w``'s error: it ends ``w`` only, or every worker.

        A worker that is not ``responsive`` (stalled) is not asked to stop first.
        """
        if not self._error_ends_worker:
            if not responsive:
                _stop_process(self._shutdown.procs[w], None, ask=False)
            self.close()
            return error
        sd = self._shutdown
        if isinstance(error, (WorkerDiedError, WorkerStalledError)):
            self._dead = (w, error)
        else:
            self._failed[w] = True
        _stop_process(sd.procs[w], sd.controls[w], ask=responsive)
        return _WorkerFailed(error)

    def _release_ready(self) -> None:
        """Lets every held worker that has loaded its task go on by itself."""
        sd = self._shutdown
        if sd.launch_error is not None:
            raise sd.launch_error
        for w in range(sd.launched):
            if not self._held[w] or self.exhausted[w] or self._failed[w] or not sd.results[w].poll():
                continue
            try:
                msg = self._recv(w)
            except WorkerDiedError as e:
                raise self._failure(w, e) from None
            if msg[0] == ERR:  # The task failed to load in the worker.
                raise self._failure(w, _rebuild_error(w, sd.procs[w].pid, msg))
            if msg[0] != READY:
                raise RuntimeError(f"unexpected message from held worker {w}: {msg[0]!r}")
            local = self._local.pop(w, None)
            if local is not None:
                local.close()
            try:
                sd.controls[w].send((START, self.states[w]))
            except (OSError, ValueError):
                # The worker died after it reported ready.
                if self._closed:
                    raise self._closed_error(w) from None
                raise self._failure(w, self._died_error(w)) from None
            self._held[w] = False

    def _local_output(self, w: int) -> tuple[bool, Any]:
        """Worker ``w``'s next output, computed here; ``(False, None)`` at its end."""
        local = self._local.get(w)
        if local is None:
            local = self._task.outputs(w, self._w, self.states[w], None)
            self._local[w] = local
        try:
            state, output = next(local)
        except StopIteration:
            # As for a worker's "end".
            del self._local[w]
            self.exhausted[w] = True
            self.states[w] = self._task.end_state(w, self._w, self.states[w])
            self._advance(w)
            return False, None
        except SystemExit as e:
            # In worker w, sys.exit() would end that process (see worker_main); here
            # it must not end the caller's.
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            raise WorkerDiedError(
                f"Worker process was terminated unexpectedly with exit code {code}: "
                f"sys.exit({e.code!r}) in the outputs of grainlike worker {w} of {self._w}, "
                "computed in the calling process while the worker starts (warm_start); "
                f"its state after its last delivered output: {self.states[w]!r}"
            ) from e
        except Exception as e:
            add_note(
                e,
                f"grainlike: raised in the calling process, which computes worker {w}'s "
                "outputs while it starts (warm_start=False runs every transform in the "
                "workers)",
            )
            raise
        self.states[w] = state
        self._advance(w)
        return True, output

    def close(self, dropped: bool = False) -> None:
        """Stops the workers and releases their resources. Idempotent.

        Arrays already returned stay valid for as long as they are referenced.

        Args:
          dropped: the pool's owner is being collected, so nothing will read what
            the workers compute: a worker in the middle of an output is
            terminated after 0.1 s rather than 2 s, and the caller (a finalizer)
            does not block for longer.
        """
        self._closed = True
        _live.discard(self)
        for local in self._local.values():
            try:
                local.close()
            except Exception:  # Never let cleanup hide what is being raised.
                pass
        self._local.clear()
        if self._finalizer.detach() is not None:
            self._shutdown(_DROPPED_JOIN_TIMEOUT_S if dropped else _JOIN_TIMEOUT_S)


def _launch(
    sd: _Shutdown,
    payload: bytes,
    worker_count: int,
    starts: list,
    exhausted: list,
    buffer_size: int,
    profile: bool,
    hold: bool,
    on_release: list,
) -> None:
    """Starts the worker processes, registering each with ``sd`` once it runs.

    An exhausted worker's process only waits to be stopped.
    Stops early if ``sd`` is shutting down; a failure is kept in
    ``sd.launch_error`` for the consumer to raise (it may run in a thread).
    """
    forked = not hold and fork_is_safe()
    served = not forked and worker_server.server_supported()
    if forked:
        from grainlike.dataset import worker_main  # noqa: F401  (imported once, here, not in each child)

        ctx = multiprocessing.get_context("fork")
    elif served:
        ctx = multiprocessing.get_context("forkserver")
        server = worker_server.running_server()
    else:
        ctx = multiprocessing.get_context("spawn")
    try:
        for w in range(worker_count):
            if sd.done:
                return
            # A socket: segment descriptors travel with the outputs (SCM_RIGHTS).
            result_r, result_w = ctx.Pipe(duplex=True)
            control_r, control_w = ctx.Pipe(duplex=False)
            stack_r, stack_w = os.pipe()
            os.set_inheritable(stack_r, False)
            progress = None if sd.progress is None else PassedFd(sd.progress.fd)
            shipped = {token: PassedFd(fd) for token, fd in sd.shipped.items()}
            args = (
                payload, w, worker_count, starts[w], buffer_size,
                result_w, control_r, os.getpid(), profile, hold,
                exhausted[w], (progress, w, PassedFd(stack_w)), shipped,
            )
            if forked:
                proc = _ForkedWorkerProcess(
                    target=_forked_entry,
                    args=([result_r.fileno(), control_w.fileno(), stack_r], *_as_inherited(args)),
                    name=f"grainlike-worker-{w}",
                    daemon=True,
                )
            elif served:
                proc = worker_server.WorkerProcess(
                    target=_worker_entry, args=args, name=f"grainlike-worker-{w}", daemon=True
                )
                worker_server.server_of[proc] = server
            else:
                proc = worker_server.SpawnedWorkerProcess(
                    target=_worker_entry, args=args, name=f"grainlike-worker-{w}", daemon=True
                )
            try:
                proc.start()
            except BaseException:
                os.close(stack_r)
                raise
            finally:
                # Only the worker may hold these ends, so that EOF means its exit.
                result_w.close()
                control_r.close()
                os.close(stack_w)
            sd.procs.append(proc)
            sd.results.append(result_r)
            sd.controls.append(control_w)
            sd.stacks.append(stack_r)
            sd.readers.append(shm.SegmentReader(on_release[w]))
            sd.launched = w + 1
    except BaseException as e:  # noqa: B902 - handed to the consumer
        if sd.launcher is None:
            raise
        sd.launch_error = e
    finally:
        if sd.progress is not None:
            sd.progress.close_fd()
        memfd.close_all(sd.shipped)  # Every worker has its copy.


def _worker_entry(*args) -> None:
    from grainlike.dataset import worker_main

    worker_main.run(*args)


def _rebuild_error(w: int, pid: int, msg: tuple) -> BaseException:
    """The exception a worker sent (see ``worker_main._send_error``), as close to itself as possible.

    In order: the exception itself; else an instance of its type carrying its
    message and notes; else a ``WorkerError`` naming the type.
    """
    _, _, payload, type_name, text, tb, type_payload, notes, why, frames = msg
    error = None
    if payload is not None:
        try:
            error = cloudpickle.loads(payload)
            notes = []  # They travelled with it.
        except Exception as e:
            error, why = None, f"{type(e).__name__}: {e}"
    if error is None and type_payload is not None:
        try:
            cls = cloudpickle.loads(type_payload)
            error = cls.__new__(cls)
            error.args = (text,)
        except Exception:
            error = None
    if error is None:
        error = WorkerError(f"{type_name}: {text}")
        why = f"grainlike: the worker's {type_name} could not be sent ({why}) nor rebuilt from its type"
    elif why:
        why = (
            f"grainlike: the worker's exception could not be sent as itself ({why}); this is "
            f"an instance of its type rebuilt from its message, without its other "
            f"attributes; the message: {text}"
        )
    for note in notes:
        add_note(error, note)
    if why:
        add_note(error, why)
    add_note(error, f"grainlike: raised in worker {w} (pid {pid}); the worker's traceback:\n{tb.rstrip()}")
    # The worker's frames as the traceback's innermost entries (as grain does).
    return error.with_traceback(traceback_from_frames(frames))
