"""The body of a worker process: runs one worker's share of a ``WorkerTask``.

Preloaded by the forkserver, so forking a worker does not import anything new.
Never imports jax.
"""

from __future__ import annotations

import faulthandler
import logging
import mmap
import os
import pickle
import signal
import struct
import sys
import threading
import time
from multiprocessing.connection import wait
from typing import Any, Callable, Optional

import cloudpickle
import numpy as np  # Also preloaded for the forked workers.

from grainlike.core import memfd
from grainlike.workers import frames, server, shm
from grainlike.workers.error_transfer import describe_origin, explain_unpicklable, send_error
from grainlike.workers.guards import (
    ExitReports,
    ForkedFromWorker,
    exit_code,
    exit_now,
    exit_report,
    real_exit,
    what_ended,
)
from grainlike.workers.messages import END, READY, RESET, RESET_DONE, START, STOP, Interruptible
from grainlike.workers.receiving import Credits


# Small outputs travel up to this many to a message, and up to about this many
# bytes; a group waits at most about this long once the consumer has taken all.
_GROUP_MAX = 32
_GROUP_BYTES = 64 * 1024
_GROUP_WAIT_S = 0.02


def _write(conn: Any, message: bytes) -> None:
    """Writes ``message`` (a frame: its length comes first, ``frames.frame``) whole to ``conn``."""
    fd = conn.fileno()
    view = memoryview(message)
    while view:
        view = view[os.write(fd, view) :]


class _Outbox:
    """Sends a worker's messages; small outputs several to a message.

    The per-message cost is more than a small batch's whole work (W1: ~50 us per
    message, ~35 us to make a batch of 128 records). So outputs with no leaf in
    shared memory wait here, as records, and travel as one ``OUTS`` frame, which
    takes one credit. They leave when the group is full, before any other
    message, at once for a worker's first output (and first after a reset), and
    when the consumer has taken every message sent and the group has waited
    ``_GROUP_WAIT_S`` (the control thread sends it): a slow output never holds
    back the ones before it. Nothing else changes: outputs, order, states.
    """

    def __init__(self, results: Any, control: Any, credits: Credits, stop: threading.Event, guard: Callable[[], None]):
        self._results = results
        self._control = control  # New segments' descriptors go back on it (``shm.send_fds``).
        self._credits = credits
        self._stop = stop
        self._guard = guard  # Called before anything is queued or sent (see run's own_process).
        self._lock = threading.Lock()  # One sender at a time; guards the group.
        self._group: list = []
        self._bytes = 0
        self._since = 0.0  # When the group's first output came.
        self._sent = 0  # Messages sent (under the lock); taken: ``credits.taken``.
        self._first = True  # The next output leaves at once.
        self.writer = frames.Writer()  # Encodes the outputs (see ``frames``).
        # Written when a group starts waiting: the control thread, asleep until then, times it.
        self.started_r, self.started_w = os.pipe()
        os.set_blocking(self.started_r, False)

    def _send_group(self, credit: bool) -> None:
        # With self._lock held.
        if not self._group:
            return
        if credit:
            self._credits.acquire()
            if self._stop.is_set():
                return
        message = frames.frame(frames.OUTS_KIND, self._group)
        self._group, self._bytes = [], 0
        _write(self._results, message)
        self._sent += 1
        self._first = False

    def add(self, record: bytes) -> None:
        """Queues one small output (its record, ``frames.Writer.record``)."""
        self._guard()
        with self._lock:
            if not self._group:
                self._since = time.monotonic()
            self._group.append(record)
            self._bytes += len(record)
            if (
                len(self._group) >= _GROUP_MAX
                or self._bytes >= _GROUP_BYTES
                or self._first
                or (self._sent == self._credits.taken and time.monotonic() - self._since >= _GROUP_WAIT_S)
            ):
                self._send_group(credit=True)
            elif len(self._group) == 1:  # A group starts: the control thread times it from now.
                os.write(self.started_w, b"x")

    def send(self, message: bytes, fds: list) -> None:
        """Sends one output's message (after the waiting group), then its new segments' fds."""
        self._guard()
        with self._lock:
            try:
                self._send_group(credit=True)
                self._credits.acquire()
                if self._stop.is_set():
                    return
                _write(self._results, message)
                self._sent += 1
                self._first = False
                if fds:
                    shm.send_fds(self._control, fds)
            finally:
                for fd in fds:
                    os.close(fd)

    def flush(self, credit: bool = True) -> None:
        """Sends the waiting group (before an end or an error message)."""
        self._guard()
        with self._lock:
            self._send_group(credit)

    def send_last(self, message: Any, timeout: float) -> bool:
        """Sends the waiting group and then ``message`` without credits, if no other send holds the socket within ``timeout``.

        For the report of a worker about to end: returns whether it was sent.
        """
        self._guard()
        if not self._lock.acquire(timeout=timeout):
            return False
        try:
            self._send_group(credit=False)
            self._results.send(message)
            return True
        finally:
            self._lock.release()

    def restart(self) -> None:
        """Drops the waiting group (a reset: the consumer drops those outputs anyway); the next output leaves at once.

        The consumer drops what was sent before the reset too, layout definitions
        included: each layout is defined again where next used.
        """
        with self._lock:
            self._group, self._bytes = [], 0
            self._first = True
            self.writer.forget_announced()

    def credited(self) -> None:
        """Credits came in (``Credits.on_credit``): a waiting group may now be due, so the control thread looks.

        Without it, a credit the main thread read (``SegmentPool.refill``) would
        leave the control thread asleep on the drained pipe for up to a second.
        """
        if self._group:
            os.write(self.started_w, b"x")

    def wait_s(self) -> Optional[float]:
        """How long the control thread may sleep before a group may be due; None: no group waits.

        While one waits, the control thread also wakes on the consumer's credits.
        """
        if not self._group:
            return None
        waited = time.monotonic() - self._since
        return _GROUP_WAIT_S - waited if waited < _GROUP_WAIT_S else 1.0

    def send_if_due(self) -> None:
        """Sends a group that waited ``_GROUP_WAIT_S`` while the consumer has taken everything (control thread)."""
        if not self._group or self._sent != self._credits.taken or time.monotonic() - self._since < _GROUP_WAIT_S:
            return
        # Never wait for the lock: its holder is sending anyway, and this thread must stay free to see STOP.
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._group and self._sent == self._credits.taken and self._credits.acquire(blocking=False):
                self._send_group(credit=False)
        finally:
            self._lock.release()


# CPU time (of the process, less the sampling thread) per sample that counts as progress.
_BUSY_CPU_S = 0.002


class _Progress:
    """This worker's slot of the pool's progress page (see ``liveness.Progress``).

    ``sample()`` counts a move whenever the worker moved since the last sample:
    it used CPU time (in any thread but the sampling one), or its main thread is
    somewhere else. A worker blocked in one call stops counting. Only the count
    is shared: the consumer times it with its own clock.
    """

    def __init__(self, fd: int, slot: int):
        try:
            self._mm = mmap.mmap(fd, 0)  # The whole page(s): beyond 512 workers, slots pass the first.
        finally:
            os.close(fd)
        self._offset = slot * 8
        self._main = threading.main_thread().ident
        self._where = None
        self._cpu = 0.0
        self._sampled = 0.0
        self._moves = 0
        self.sample(force=True)

    def sample(self, force: bool = False) -> None:
        now = _monotonic()
        if not force and 0.0 <= now - self._sampled < 0.25:
            return
        self._sampled = now
        cpu = time.process_time() - time.thread_time()
        frame = sys._current_frames().get(self._main)
        where = None if frame is None else (id(frame), frame.f_lasti)
        del frame
        if force or where != self._where or cpu - self._cpu >= _BUSY_CPU_S:
            self._moves += 1
            struct.pack_into("Q", self._mm, self._offset, self._moves)
        self._where, self._cpu = where, cpu


# The clock as this module was loaded: a transform that replaces time.monotonic
# does not change when the worker samples itself.
_monotonic = time.monotonic


# glibc's mallopt parameters, and the largest values its own adaptive thresholds
# reach (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit, and twice that for trimming).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 32 << 20
_TRIM_THRESHOLD = 64 << 20
_USER_MALLOC_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")


def keep_freed_memory() -> bool:
    """Lets glibc's malloc keep freed memory in this worker for the next batch.

    With glibc's starting thresholds the freed top of the heap goes back to the
    system after each batch and the next faults it in again (10% of a JPEG
    pipeline's CPU). Here they start where glibc's adaptive ones end up, so a
    worker's resident memory stays at its peak. The user's own settings
    (``MALLOC_*_``, ``GLIBC_TUNABLES``, a preloaded allocator) are left alone.

    Returns:
      Whether the thresholds were set.
    """
    env = os.environ
    if any(k in env for k in _USER_MALLOC_SETTINGS) or "malloc" in env.get("GLIBC_TUNABLES", ""):
        return False
    if "malloc" in env.get("LD_PRELOAD", ""):  # jemalloc, tcmalloc, mimalloc: their own policy.
        return False
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (ImportError, OSError, AttributeError):
        return False  # Not glibc.
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))


def _watch(watch) -> "_Progress | None":
    """Sets up the liveness report: the progress slot, and stacks on request."""
    if watch is None:
        return None
    progress_fd, slot, stack_fd = watch
    try:
        # The pool sends it when the worker stalls; chain=False: the signal is ours.
        faulthandler.register(signal.SIGUSR1, file=stack_fd, all_threads=True, chain=False)
    except (AttributeError, ValueError, OSError):
        pass  # Then the stall report has no stack.
    return None if progress_fd is None else _Progress(progress_fd, slot)


def run(
    task_bytes: bytes,
    worker_index: int,
    worker_count: int,
    start: Any,
    buffer_size: int,
    results,
    control,
    consumer_pid: int = 0,
    profile: bool = False,
    hold: bool = False,
    idle: bool = False,
    watch: Any = None,
    shipped: Any = None,
    ticks: int = -1,
) -> None:
    """Produces one worker's outputs and sends them to the consumer (see ``messages``).

    ``results`` and ``control`` are Unix sockets; an ``OUT``'s new segments'
    descriptors go back on ``control``; the consumer's credits come on the
    pipe ``ticks`` (``Credits``). If the
    consumer goes (its control socket closes, or its pid is gone), the worker
    exits at once. A ``RESET`` may come at any time: the worker stops after the
    output in hand, drops what it has not sent, sends ``RESET_DONE`` and goes on
    from the reset's state in the same process (the task is loaded once).

    With ``hold``, the worker sends ``READY`` once its task is loaded and waits
    for ``START``: meanwhile the consumer computes this worker's first outputs.
    An ``idle`` worker (already exhausted) produces nothing until a reset.

    ``sys.exit()``, ``os._exit()`` and ``KeyboardInterrupt`` in the user's code
    end the worker after an ``EXIT`` report naming where they were called; a
    process the user's code forks never delivers anything (``guards``).

    ``watch`` is ``(progress fd or None, slot, stack fd)``: where the worker
    records its progress and writes its stacks on ``SIGUSR1``. ``shipped`` maps
    tokens to descriptors of anonymous memory the task refers to (see
    ``core.memfd``); they stay open for the worker's life.
    """
    # Ctrl-C goes to the whole process group; the consumer stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Started with it blocked (``server.sigint_held``): one that came meanwhile is dropped.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    server.default_exit_signals()  # Inherited from a consumer it forked from: a worker ends at once.
    own = ForkedFromWorker(worker_index, [results.fileno(), control.fileno()])
    shm.raise_fd_limit()
    keep_freed_memory()
    memfd.receive(shipped or {})
    progress = _watch(watch)
    pool = shm.SegmentPool() if shm.available() else None
    pool_lock = threading.Lock()

    def returned(ids: list) -> None:
        if pool is not None:
            with pool_lock:
                pool.release(ids)

    credits = Credits(ticks, buffer_size, returned)
    if pool is not None:
        pool.refill = credits.read  # (Called with pool_lock held.)
    stop = threading.Event()
    started = threading.Event()
    # Set on STOP and on RESET: whatever the main thread waits for, it looks again.
    wake = threading.Event()
    start_at = [start]
    # The latest RESET not yet done, (epoch, state, exhausted): a newer one replaces it.
    reset_lock = threading.Lock()
    reset_at: list = [None]
    task = None
    outputs: Any = None

    def send(message: tuple) -> None:
        own.check()
        results.send(message)

    def listen() -> None:
        try:
            while True:
                # EOF on the control pipe says the consumer died; its pid too, should
                # the pipe end have leaked into another process it forked.
                idle_s = 1.0 if progress is None else 0.5
                due = outbox.wait_s()
                if due is None:  # (Not woken by the consumer's credits: they wait for the main thread.)
                    ready = wait([control, outbox.started_r], idle_s)
                else:  # A group waits for its time, and for the consumer to take what was sent.
                    ready = wait([control, outbox.started_r, credits.fd], min(due, idle_s))
                idle_tick = control not in ready
                if outbox.started_r in ready:
                    os.read(outbox.started_r, 4096)
                if progress is not None:
                    progress.sample()
                credits.take_in()
                outbox.send_if_due()
                if idle_tick:
                    if consumer_pid and not server.pid_alive(consumer_pid):
                        real_exit(0)  # The consumer is gone.
                    continue
                msg = control.recv()
                if msg[0] == RESET:
                    with reset_lock:
                        reset_at[0] = msg[1:]
                    wake.set()
                elif msg[0] == START:
                    start_at[0] = msg[1]
                    started.set()
                elif msg[0] == STOP:
                    break
        except (EOFError, OSError):
            real_exit(0)
        stop.set()
        started.set()
        wake.set()
        credits.release()
        # Now, not when the main thread next looks: a dropped iterator's reads end
        # within the reads in progress (the task's optional method).
        if isinstance(task, Interruptible):
            try:
                task.interrupt()
            except Exception:  # noqa: BLE001 - the worker exits either way
                pass

    outbox = _Outbox(results, control, credits, stop, own.check)
    credits.on_credit = outbox.credited
    exits = ExitReports(outbox, own)
    exits.install()
    threading.Thread(target=listen, name="grainlike-control", daemon=True).start()

    produced = 0
    busy = waited = 0.0
    clock = time.perf_counter
    alloc = None
    if pool is not None:

        def alloc(shape, dtype):
            own.check()  # A forked copy must not write into the worker's segments.
            with pool_lock:
                return pool.alloc(shape, dtype)

    def interrupted() -> bool:
        return stop.is_set() or reset_at[0] is not None

    def produce(start: Any, first: bool) -> None:
        """Sends the outputs from ``start`` on, then the end or the error; stops early if interrupted."""
        nonlocal task, outputs, produced, busy, waited
        state = start
        exits.state = state
        exits.running = True
        try:
            if task is None:
                task = cloudpickle.loads(task_bytes)
                if hold and first:
                    send((READY,))
                    started.wait()
                    state = start = start_at[0]
                    exits.state = state
            if stop.is_set():
                return  # Stopped while held: nothing to produce.
            outputs = task.outputs(worker_index, worker_count, start, alloc)
            t0 = clock()
            before = start
            for state, output in outputs:
                own.check()
                unsent = []
                inline = True
                if pool is not None:
                    with pool_lock:
                        lends = pool.lends()
                        output = pool.export(output)
                        inline = pool.lends() == lends  # (No leaf in shared memory.)
                        unsent = pool.take_unsent()
                try:
                    if inline and not unsent:
                        message = outbox.writer.record(state, output)
                    else:
                        message = outbox.writer.record(state, output, pickle.DEFAULT_PROTOCOL)
                        message = frames.frame(frames.OUT_KIND, [message], [u[:2] for u in unsent])
                except Exception as e:
                    if pool is not None:
                        pool.keep_unsent(unsent)  # Sent with a later output instead.
                    explain_unpicklable(e, output, describe_origin(task, worker_index, worker_count, before, state))
                    state = before  # The output was not delivered.
                    raise
                del output
                before = state
                t1 = clock()
                busy += t1 - t0
                if inline and not unsent:
                    outbox.add(message)
                else:
                    outbox.send(message, [u[2] for u in unsent])
                exits.state = state
                del message
                if interrupted():
                    return
                t0 = clock()
                waited += t0 - t1
                produced += 1
            if not interrupted():
                outbox.flush()
            if not interrupted():
                send((END, task.end_state(worker_index, worker_count, state)))
        except BaseException as e:  # noqa: B902 - everything goes to the consumer
            exits.running = False
            if os.getpid() != own.pid and not isinstance(e, Exception):
                exit_now(exit_code(e))  # A forked copy ending itself with sys.exit().
            own.check()
            if not isinstance(e, Exception):
                # sys.exit(), KeyboardInterrupt raised by the user's code (the worker
                # ignores SIGINT): the worker ends, as the interpreter would, after
                # reporting where (the consumer raises WorkerDiedError naming it).
                if not stop.is_set():
                    report = exit_report(
                        state, exit_code(e), what_ended(e), tb=e.__traceback__, notes=getattr(e, "__notes__", ()),
                    )
                    outbox.send_last(report, timeout=5.0)
                exit_now(exit_code(e))
            if not stop.is_set():
                # The outputs before it are delivered first (without a credit: the
                # consumer reads every message in order).
                outbox.flush(credit=False)
                try:
                    send_error(results, state, e)
                except Exception:
                    # Without a report the consumer would wait for this worker: exit,
                    # so that it reports the exit instead.
                    real_exit(70)
        finally:
            exits.running = False

    first = True
    while True:
        if not idle and not interrupted():
            produce(start, first)
        first = False
        # Done, failed or interrupted: wait to be stopped or reset (cleared first,
        # so that a wake after the look ends the wait).
        while True:
            wake.clear()
            if stop.is_set():
                break
            with reset_lock:
                reset, reset_at[0] = reset_at[0], None
            if reset is not None:
                break
            wake.wait()
        if stop.is_set():
            break
        epoch, start, idle = reset
        if outputs is not None:  # Closes the old iterator (the generator's finally).
            try:
                outputs.close()
            except Exception:  # noqa: BLE001 - as when a stopped worker exits
                pass
            outputs = None
        outbox.restart()
        send((RESET_DONE, epoch))
    if profile:
        logging.getLogger("grainlike").warning(
            "grainlike worker %d of %d: %d outputs, %.3f s producing (%.2f ms each), "
            "%.3f s waiting for the consumer",
            worker_index, worker_count, produced, busy, 1e3 * busy / max(produced, 1), waited,
        )
    stop.wait()
    results.close()
    sys.stdout.flush()

