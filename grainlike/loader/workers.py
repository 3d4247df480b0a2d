"""Worker processes: start, round-robin collection, errors, and shutdown.

Workers are forked from a forkserver that has preloaded grainlike's worker module,
so a worker starts in milliseconds and never re-runs the user's ``__main__``: the
main module's ``__file__`` and ``__spec__`` are hidden while a worker starts. The
pipeline travels as cloudpickle bytes, so lambdas and classes defined in a notebook
or an unguarded script work.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import itertools
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import weakref
from typing import Any, Optional

import cloudpickle

from grainlike.loader import shm
from grainlike.loader.options import MultiprocessingOptions
from grainlike.loader.pipeline import Pipeline, add_note, describe_op
from grainlike.loader.state import Positions

# How long close() waits for a worker to exit by itself before terminating it.
_JOIN_TIMEOUT_S = 2.0
_WORKER_MODULE = "grainlike.loader.worker_main"
_stream_ids = itertools.count()
_context_lock = threading.Lock()
_context = None


class WorkerError(RuntimeError):
    """A worker failed with an exception that could not be sent back as itself."""


class WorkerDiedError(RuntimeError):
    """A worker process exited unexpectedly (killed, crashed, out of memory)."""


def _forkserver_context():
    global _context
    with _context_lock:
        if _context is None:
            ctx = multiprocessing.get_context("forkserver")
            from multiprocessing import forkserver

            preload = list(getattr(forkserver._forkserver, "_preload_modules", []))
            if _WORKER_MODULE not in preload:
                # Keep whatever the user preloads; add ours so forks are ready at once.
                ctx.set_forkserver_preload(preload + [_WORKER_MODULE])
            _context = ctx
        return _context


@contextlib.contextmanager
def _main_module_hidden():
    """Makes multiprocessing believe there is no main module to re-import."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    missing = object()
    saved_file = main.__dict__.get("__file__", missing)
    saved_spec = main.__dict__.get("__spec__", missing)
    try:
        if saved_file is not missing:
            del main.__file__
        main.__spec__ = None
        yield
    finally:
        if saved_file is not missing:
            main.__file__ = saved_file
        if saved_spec is missing:
            main.__dict__.pop("__spec__", None)
        else:
            main.__spec__ = saved_spec


def prestart() -> None:
    """Starts the forkserver now (in the background) so the first workers fork at once.

    Called when a DataLoader with workers is built: booting the server (a fresh
    interpreter importing numpy and grainlike) then overlaps whatever the program
    does before its first ``next()``. Later loaders in the process reuse it.
    """
    ctx = _forkserver_context()
    from multiprocessing import forkserver

    try:
        with _main_module_hidden():
            forkserver.ensure_running()
    except Exception:
        pass  # Starting workers later reports the problem with its context.
    del ctx


def _raise_fd_limit() -> None:
    # Each batch leaf the user holds keeps one mapping (and descriptor) alive.
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else 1 << 16
        target = min(target, 1 << 16)
        if soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):
        pass


def pickle_pipeline(pipeline: Pipeline) -> bytes:
    """cloudpickle bytes of the pipeline, or a TypeError naming the part that fails."""
    try:
        return cloudpickle.dumps(pipeline)
    except Exception as e:
        parts = [("data_source", pipeline.data_source), ("sampler", pipeline.sampler)]
        parts += [(f"operations[{i}] {describe_op(op)}", op) for i, op in enumerate(pipeline.operations)]
        for label, part in parts:
            try:
                cloudpickle.dumps(part)
            except Exception as inner:
                raise TypeError(
                    f"cannot send the pipeline to worker processes: {label} cannot be "
                    f"pickled ({type(inner).__name__}: {inner}). Workers need picklable "
                    "sources and transforms; use worker_count=0 to run in process."
                ) from inner
        raise TypeError(f"cannot send the pipeline to worker processes: {e}") from e


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


class _Shutdown:
    """Everything a stream must release; callable once, from close(), GC or exit."""

    def __init__(self):
        self.procs: list = []
        self.controls: list = []
        self.results: list = []
        self.readers: list = []
        self.prefix = ""
        self.done = False
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            if self.done:
                return
            self.done = True
        for conn in self.controls:
            try:
                conn.send(("stop",))
            except Exception:
                pass
        for p in self.procs:
            p.join(_JOIN_TIMEOUT_S)
        for p in self.procs:
            if p.exitcode is None:
                p.terminate()
                p.join(1.0)
            if p.exitcode is None:
                p.kill()
                p.join(1.0)
        for conn in self.controls + self.results:
            try:
                conn.close()
            except Exception:
                pass
        for reader in self.readers:
            reader.close()
        for p in self.procs:
            try:
                p.close()
            except Exception:
                pass
        if self.prefix:
            # Segments a killed worker made but never sent.
            shm.unlink_prefix(self.prefix)


_live: "weakref.WeakSet[MultiprocessStream]" = weakref.WeakSet()


@atexit.register
def _close_all_at_exit() -> None:
    for stream in list(_live):
        stream.close()


class MultiprocessStream:
    """Outputs of ``worker_count`` worker processes, taken strictly round-robin.

    Args:
      pipeline: the work; worker ``w`` reads positions ``w, w + W, ...``.
      worker_count: number of worker processes (> 0).
      positions: where each worker starts and whose turn is first.
      options: buffer size per worker.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        worker_count: int,
        positions: Positions,
        options: MultiprocessingOptions,
    ):
        self._pipeline = pipeline
        self._w = worker_count
        self.positions = Positions(list(positions.next_positions), positions.next_worker)
        self._options = options
        self._payload = pickle_pipeline(pipeline)
        self._started = False
        self._exhausted = [False] * worker_count
        self._released = [collections.deque() for _ in range(worker_count)]
        self._shutdown = _Shutdown()
        self._finalizer = weakref.finalize(self, self._shutdown)
        self._closed = False

    def start(self) -> None:
        if self._started:
            return
        if self._closed:
            raise RuntimeError("the worker stream is closed")
        self._started = True
        _raise_fd_limit()
        shm.sweep_orphans()
        ctx = _forkserver_context()
        sd = self._shutdown
        sd.prefix = f"grainlike_{os.getpid()}_{next(_stream_ids)}_{os.urandom(3).hex()}_"
        _live.add(self)
        buffer_size = max(self._options.per_worker_buffer_size, 1)
        with _main_module_hidden():
            for w in range(self._w):
                result_r, result_w = ctx.Pipe(duplex=False)
                control_r, control_w = ctx.Pipe(duplex=False)
                proc = ctx.Process(
                    target=_worker_entry,
                    args=(
                        self._payload,
                        w,
                        self._w,
                        self.positions.next_positions[w],
                        buffer_size,
                        f"{sd.prefix}{w}_",
                        result_w,
                        control_r,
                        os.getpid(),
                        self._options.enable_profiling,
                    ),
                    name=f"grainlike-worker-{w}",
                    daemon=True,
                )
                proc.start()
                # Only the worker may hold these ends, so that EOF means its exit.
                result_w.close()
                control_r.close()
                sd.procs.append(proc)
                sd.results.append(result_r)
                sd.controls.append(control_w)
                released = self._released[w]
                sd.readers.append(shm.SegmentReader(released.append))

    def _recv(self, w: int) -> Any:
        sd = self._shutdown
        conn, proc = sd.results[w], sd.procs[w]
        while True:
            ready = multiprocessing.connection.wait([conn, proc.sentinel], timeout=1.0)
            if not ready:
                continue
            if conn in ready or conn.poll():
                try:
                    return conn.recv()
                except EOFError:
                    pass  # The worker is gone; report how.
            proc.join(0.5)
            raise WorkerDiedError(
                f"grainlike worker {w} of {self._w} (pid {proc.pid}) "
                f"{_describe_exit(proc.exitcode)} before finishing its records "
                f"(it had delivered up to position {self.positions.next_positions[w]}). "
                "The other workers were stopped; call next() again to restart the "
                "workers from the last delivered output, or set_state() a checkpoint."
            )

    @property
    def broken(self) -> bool:
        return self._closed

    def _tick(self, w: int) -> None:
        released = self._released[w]
        ids = []
        while released:
            ids.append(released.popleft())
        try:
            self._shutdown.controls[w].send(("tick", ids))
        except (OSError, ValueError):
            pass

    def __next__(self) -> Any:
        before = Positions(list(self.positions.next_positions), self.positions.next_worker)
        try:
            self.start()
            return self._next_output()
        except StopIteration:
            raise
        except BaseException:
            if not self._closed:
                # Interrupted (Ctrl-C, or any exception) half way: a message may be
                # half read, or taken but not returned. Stop the workers; the
                # iterator restarts them from the last output actually returned.
                self.positions = before
                self.close()
            raise

    def _next_output(self) -> Any:
        while True:
            if all(self._exhausted):
                raise StopIteration
            w = self.positions.next_worker
            if self._exhausted[w]:
                self.positions.next_worker = (w + 1) % self._w
                continue
            try:
                msg = self._recv(w)
            except WorkerDiedError:
                self.close()
                raise
            kind = msg[0]
            if kind == "out":
                output = self._shutdown.readers[w].materialize(msg[2])
                self.positions.next_positions[w] = msg[1]
                self.positions.next_worker = (w + 1) % self._w
                self._tick(w)
                return output
            if kind == "end":
                self._exhausted[w] = True
                # Like grain, a worker's position stays at its last delivered
                # output; restoring re-reads (and again drops) what followed it.
                self.positions.next_worker = (w + 1) % self._w
                continue
            if kind == "err":
                error = _rebuild_error(w, self._shutdown.procs[w].pid, msg)
                self.close()
                raise error
            raise RuntimeError(f"unexpected message from worker {w}: {kind!r}")

    def close(self) -> None:
        self._closed = True
        _live.discard(self)
        self._finalizer()


def _worker_entry(*args) -> None:
    from grainlike.loader import worker_main

    worker_main.run(*args)


def _rebuild_error(w: int, pid: int, msg: tuple) -> BaseException:
    _, position, payload, type_name, text, tb = msg
    error = None
    if payload is not None:
        try:
            error = cloudpickle.loads(payload)
        except Exception:
            error = None
    if error is None:
        error = WorkerError(f"{type_name}: {text}")
    add_note(error, f"grainlike: raised in worker {w} (pid {pid}); the worker's traceback:\n{tb.rstrip()}")
    return error
