"""Process start: workers fork from the calling process, from the worker server, or are spawned.

Workers fork from the calling process while that is safe (``fork_is_safe``), as
torch's do; otherwise from the worker server (``server``), so a worker starts in
milliseconds either way; where there is no server they are spawned
(docs/platforms.md). None re-runs the user's ``__main__``, and the task travels
as cloudpickle bytes (``pickle_task``), so lambdas and notebook classes work.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.context
import os
import sys
import threading
from typing import Any

from grainlike.core import memfd, pickling
from grainlike.workers import server, shm, worker_process
from grainlike.workers.liveness import POLL_S
from grainlike.workers.messages import WorkerTask
from grainlike.workers.receiving import set_receive_timeout
from grainlike.workers.shutdown import Shutdown


class PassedFd:
    """A file descriptor handed to a worker as it starts: in the worker, the int of its own copy."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction

        return (_detach_fd, (reduction.DupFd(self.fd),))


def _detach_fd(dup: Any) -> int:
    return dup.detach()


def _jax_backend_initialised() -> bool:
    """Whether JAX has started a backend (its runtime threads) in this process."""
    xla_bridge = sys.modules.get("jax._src.xla_bridge")
    if xla_bridge is None:
        return False
    backends = getattr(xla_bridge, "_backends", None)
    # A JAX that keeps its backends elsewhere: assume they may be running.
    return not isinstance(backends, dict) or bool(backends)


# The modules whose threads a fork may leave behind: a Jupyter kernel's threads
# wait on sockets and pipes and hold no lock a worker takes, and ipykernel
# supports forked children. Without them no notebook could fork its workers.
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
    logging, an allocator, JAX's runtime) stays locked forever in the child. So
    this process must run no thread (Python or native) but those it ran when
    grainlike was imported (and ``_FORK_TOLERANT`` ones), and no JAX backend.
    Then a fork is the worker server's, minus the round trip (W4, W4k).
    """
    if sys.platform != "linux" or not hasattr(os, "fork"):
        return False
    if _jax_backend_initialised():
        return False
    current = threading.current_thread()
    if any(t is not current and not _fork_tolerant(t) for t in threading.enumerate()):
        return False
    # Native threads too (an ArrayRecord reader's pool, OpenCV's): a forked
    # child reading ArrayRecord with its parent's pool copied crashes.
    return 0 < server.native_thread_count() <= server.THREADS_AT_IMPORT


def _forked_entry(parent_ends: list, *args) -> None:
    # Only the consumer may hold its ends of this worker's pipes, so that each
    # side sees EOF when the other exits (earlier workers': _after_fork_in_child).
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
    """Starts the worker server now (when a loader with workers is built), unless workers would fork from here."""
    if not fork_is_safe() and server.server_supported():
        server.start_quietly()


def pickle_task(task: WorkerTask) -> tuple[bytes, dict]:
    """cloudpickle bytes of the task, or the task's own error naming what fails.

    Returns:
      ``(bytes, shipped)``: ``shipped`` maps tokens to descriptors of the
      anonymous memory the task refers to (an ``InMemoryDataSource``'s data),
      which every worker receives with the bytes; the caller closes them.
    """
    with memfd.shipping() as shipped:
        try:
            return pickling.dumps(task), shipped
        except Exception as e:
            raise task.pickling_error(e) from e


def launch(
    sd: Shutdown,
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

    An exhausted worker's process only waits to be stopped. Stops early if
    ``sd`` is shutting down; a failure is kept in ``sd.launch_error`` for the
    consumer to raise (it may run in a thread).
    """
    forked = not hold and fork_is_safe()
    served = not forked and server.server_supported()
    if forked:
        from grainlike.workers import main  # noqa: F401  (imported once, here, not in each child)
    elif served:
        serving = server.running_server()
    try:
        for w in range(worker_count):
            if sd.done:
                return
            # A Ctrl-C while a worker forks or spawns waits until it is registered here
            # (then the pool stops it), and the worker starts with it blocked until it
            # ignores it. A served worker forks from the server, which ignores it.
            with contextlib.nullcontext() if served else server.sigint_held():
                result_r, result_w = multiprocessing.Pipe(duplex=True)
                set_receive_timeout(result_r, POLL_S)  # The pool waits for a message in its read.
                # A socket too: the worker sends new segments' descriptors back on it, so that
                # the results socket carries bytes only (read ahead of a message's end safely).
                control_r, control_w = multiprocessing.Pipe(duplex=True)
                stack_r, stack_w = os.pipe()
                os.set_inheritable(stack_r, False)
                tick_r, tick_w = os.pipe()  # Credits back to the worker (``receiving.Credits``).
                os.set_inheritable(tick_w, False)
                progress = None if sd.progress is None else PassedFd(sd.progress.fd)
                shipped = {token: PassedFd(fd) for token, fd in sd.shipped.items()}
                args = (
                    payload, w, worker_count, starts[w], buffer_size,
                    result_w, control_r, os.getpid(), profile, hold,
                    exhausted[w], (progress, w, PassedFd(stack_w)), shipped, PassedFd(tick_r),
                )
                if forked:
                    cls, target = multiprocessing.context.ForkProcess, _forked_entry
                    args = ([result_r.fileno(), control_w.fileno(), stack_r, tick_w], *_as_inherited(args))
                else:
                    cls, target = (worker_process.WorkerProcess if served else worker_process.SpawnedWorkerProcess), _worker_entry
                proc = cls(target=target, args=args, name=f"grainlike-worker-{w}", daemon=True)
                try:
                    _start(proc, serving if served else None)
                except BaseException:
                    os.close(stack_r)
                    os.close(tick_w)
                    raise
                finally:
                    # Only the worker may hold these ends, so that EOF means its exit.
                    result_w.close()
                    control_r.close()
                    os.close(stack_w)
                    os.close(tick_r)
                sd.procs.append(proc)
                sd.results.append(result_r)
                sd.controls.append(control_w)
                sd.stacks.append(stack_r)
                sd.ticks.append(tick_w)
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


# Tries to start a worker through the worker server before the failure is raised.
_SERVER_TRIES = 3


def _start(proc: Any, serving: Any) -> None:
    """Starts ``proc``, through the worker server ``serving`` unless None.

    A server that has died (or refuses connections while dying) is replaced, and
    one that dropped the request is asked again: the next iterator starts even
    if something made the last server end.
    """
    if serving is None:
        proc.start()
        return
    for attempt in range(_SERVER_TRIES):
        worker_process.server_of[proc] = serving
        try:
            proc.start()
            return
        except server.SERVER_FAILURES as e:
            worker_process.server_of.pop(proc, None)
            if attempt == _SERVER_TRIES - 1:
                raise
            server.recover(serving, e)


def _worker_entry(*args) -> None:
    from grainlike.workers import main

    main.run(*args)
