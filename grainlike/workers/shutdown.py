"""Stopping workers: one owner releases a pool's processes, pipes and memory, once.

``Shutdown`` is called once, from ``close()``, garbage collection or exit (on
SIGTERM / SIGHUP too). A forked child drops its copies of its parent's pools
(``_after_fork_in_child``) and never stops the parent's workers.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
import weakref
from typing import Any, Callable, Optional, Protocol

from grainlike.core import memfd
from grainlike.workers import server
from grainlike.workers.liveness import Progress
from grainlike.workers.messages import STOP

# How long close() waits for the workers to exit before terminating them; and
# when the pool's owner was dropped (nothing will read what they compute): an
# idle worker exits on its stop message within that, one in the middle of a
# transform gets SIGTERM then, so that all are gone within 100 ms of the drop
# (measured: 35-40 ms from del to exit, mid-transform, on a loaded 2-core machine).
JOIN_TIMEOUT_S = 2.0
DROPPED_JOIN_TIMEOUT_S = 0.03


def quietly(close: Callable, *args: Any) -> None:
    """Calls ``close(*args)``, ignoring its failure (the thing is gone already; cleanup goes on)."""
    try:
        close(*args)
    except Exception:
        pass


def ask_to_stop(control: Any) -> None:
    quietly(control.send, (STOP,))


def force_exit(proc: Any) -> None:
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


def stop_process(proc: Any, control: Any, ask: bool = True) -> None:
    """Asks one worker to stop (unless ``ask`` is False: it cannot act on it), then makes it."""
    if ask:
        ask_to_stop(control)
        proc.join(JOIN_TIMEOUT_S)
    force_exit(proc)


class Shutdown:
    """Everything a pool must release; callable once, from close(), GC or exit."""

    def __init__(self):
        self.procs: list = []
        self.controls: list = []
        self.results: list = []
        self.readers: list = []
        # Read ends of the pipes each worker writes its stacks to; write ends of its tick pipe.
        self.stacks: list = []
        self.ticks: list = []
        self.progress: Optional[Progress] = None
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
        self.asked = False

    def __call__(self, join_timeout_s: float = JOIN_TIMEOUT_S) -> None:
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
        self.ask_all()
        deadline = time.monotonic() + join_timeout_s
        for p in self.procs:
            p.join(max(deadline - time.monotonic(), 0.0))
        for p in self.procs:
            force_exit(p)
        self.close_ends()
        for reader in self.readers:
            reader.close()
        if self.progress is not None:
            self.progress.close()

    def ask_all(self) -> None:
        """Sends each worker its stop message, once: all are asked first, to exit together."""
        if self.asked or os.getpid() != self.owner_pid:
            return
        self.asked = True
        for conn in self.controls:
            ask_to_stop(conn)

    def close_ends(self) -> None:
        """Closes this process's ends of the workers' pipes and sockets."""
        for conn in self.controls + self.results:
            quietly(conn.close)
        stacks, self.stacks = self.stacks, []
        ticks, self.ticks = self.ticks, []
        for fd in stacks + ticks:
            quietly(os.close, fd)
        for p in self.procs:
            quietly(p.close)


class OwnsWorkers(Protocol):
    """A pool as this module sees it (``pool.WorkerPool``): the ``Shutdown`` of its workers, and ``close()``."""

    _shutdown: Shutdown

    def close(self) -> None: ...


live_pools: "weakref.WeakSet[OwnsWorkers]" = weakref.WeakSet()
# Threads stopping the workers of dropped pools; exit waits for them.
_stopping: "set[threading.Thread]" = set()


def stop_in_background(shutdown: Shutdown) -> None:
    """Runs a dropped pool's ``shutdown`` in a thread: the finalizer that drops it returns at once.

    On a loaded host a worker can take most of a second to act on its stop
    message or SIGTERM; the code that dropped the iterator need not wait for it.
    """

    if shutdown.launcher is None:
        shutdown.ask_all()  # Now: the workers stop reading before the finalizer returns.

    def stop() -> None:
        try:
            shutdown(DROPPED_JOIN_TIMEOUT_S)
        finally:
            _stopping.discard(thread)

    thread = threading.Thread(target=stop, name="grainlike-stop-workers", daemon=True)
    _stopping.add(thread)
    try:
        thread.start()
    except RuntimeError:  # No thread starts at interpreter shutdown: stop them here.
        _stopping.discard(thread)
        shutdown(DROPPED_JOIN_TIMEOUT_S)


@atexit.register
def _close_all_at_exit() -> None:
    for pool in list(live_pools):
        if pool._shutdown.owner_pid == os.getpid():
            pool.close()
    for thread in list(_stopping):
        if thread is not threading.current_thread():
            thread.join()


# Also on SIGTERM / SIGHUP (server.install_exit_on_signals).
server.exit_cleanups.append(_close_all_at_exit)


def _after_fork_in_child() -> None:
    """Makes a forked child independent of its parent's workers.

    The child keeps copies of the parent's pools (using one raises
    ``ForeignWorkersError``), less its copies of their pipes and multiprocessing's
    record of them as children (whose exit handler would terminate them).
    """
    from multiprocessing import process

    for pool in list(live_pools):
        sd = pool._shutdown
        sd.close_ends()
        for proc in sd.procs:
            process._children.discard(proc)
    live_pools.clear()
    _stopping.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
