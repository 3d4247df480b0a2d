"""The body of a worker process: runs one worker's share of a ``WorkerTask``.

Preloaded by the forkserver, so forking a worker does not import anything new.
Never imports jax.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

import cloudpickle
import numpy as np  # noqa: F401  (preloaded for the forked workers)

from grainlike.dataset import shm


def _send_error(conn, state: Any, error: BaseException) -> None:
    tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        payload = cloudpickle.dumps(error)
        cloudpickle.loads(payload)  # Some exceptions pickle but cannot be rebuilt.
    except Exception:
        payload = None
    try:
        text = str(error)
    except Exception:  # An exception whose __str__ fails still reaches the consumer.
        text = f"<{type(error).__qualname__} that cannot be printed>"
    conn.send(("err", state, payload, type(error).__qualname__, text, tb))


def run(
    task_bytes: bytes,
    worker_index: int,
    worker_count: int,
    start: Any,
    buffer_size: int,
    shm_prefix: str,
    results,
    control,
    consumer_pid: int = 0,
    profile: bool = False,
    hold: bool = False,
    idle: bool = False,
) -> None:
    """Produces one worker's outputs and sends them to the consumer.

    Messages out: ``("out", state, payload)``, ``("err", state, ...)`` and
    finally ``("end", state)``. Messages in: ``("tick", released_segment_ids)``
    (one more output may be sent) and ``("stop",)``. If the consumer's end of the
    control pipe closes (it exited or was killed), the worker removes its
    segments' names and exits at once.

    With ``hold``, the worker sends ``("ready",)`` once its task is loaded and
    waits for ``("start", state)``: meanwhile the consumer computes this
    worker's first outputs itself, and only it knows where they end. An ``idle``
    worker (already exhausted) produces nothing and waits to be stopped.
    """
    # Ctrl-C goes to the whole process group; the consumer decides what happens,
    # and stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pool = shm.SegmentPool(shm_prefix) if shm.available() else None
    credits = threading.Semaphore(buffer_size)
    stop = threading.Event()
    started = threading.Event()
    start_at = [start]
    pool_lock = threading.Lock()

    def consumer_gone() -> None:
        # Nobody will read or unlink what we made.
        if pool is not None:
            pool.unlink_all()
        os._exit(0)

    def listen() -> None:
        try:
            while True:
                # EOF on the control pipe says the consumer died; checking its pid
                # too covers a pipe end leaked into some other process it forked.
                if not control.poll(1.0):
                    if consumer_pid and not shm.pid_alive(consumer_pid):
                        consumer_gone()
                    continue
                msg = control.recv()
                if msg[0] == "tick":
                    if msg[1] and pool is not None:
                        with pool_lock:
                            pool.release(msg[1])
                    credits.release()
                elif msg[0] == "start":
                    start_at[0] = msg[1]
                    started.set()
                elif msg[0] == "stop":
                    break
        except (EOFError, OSError):
            consumer_gone()
        stop.set()
        started.set()
        credits.release()

    threading.Thread(target=listen, name="grainlike-control", daemon=True).start()

    state = start
    produced = 0
    busy = waited = 0.0
    clock = time.perf_counter
    alloc = None
    if pool is not None:

        def alloc(shape, dtype):
            with pool_lock:
                return pool.alloc(shape, dtype)

    try:
        if idle:
            stop.wait()
        task = None if stop.is_set() else cloudpickle.loads(task_bytes)
        if hold and task is not None:
            results.send(("ready",))
            started.wait()
            state = start = start_at[0]
        # Stopped while held: nothing to produce.
        outputs = () if stop.is_set() else task.outputs(worker_index, worker_count, start, alloc)
        t0 = clock()
        for state, output in outputs:
            if pool is not None:
                with pool_lock:
                    output = pool.export(output)
            t1 = clock()
            busy += t1 - t0
            credits.acquire()
            if stop.is_set():
                break
            results.send(("out", state, output))
            t0 = clock()
            waited += t0 - t1
            produced += 1
        else:
            if not stop.is_set():
                results.send(("end", task.end_state(worker_index, worker_count, state)))
    except BaseException as e:  # noqa: B902 - everything goes to the consumer
        if not stop.is_set():
            try:
                _send_error(results, state, e)
            except Exception:
                pass
    if profile:
        logging.getLogger("grainlike").warning(
            "grainlike worker %d of %d: %d outputs, %.3f s producing (%.2f ms each), "
            "%.3f s waiting for the consumer",
            worker_index, worker_count, produced, busy, 1e3 * busy / max(produced, 1), waited,
        )
    stop.wait()
    if pool is not None:
        pool.unlink_all()
    results.close()
    sys.stdout.flush()
