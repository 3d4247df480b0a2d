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
import functools
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


_hidden_lock = threading.Lock()
_hidden_depth = 0
_hidden_saved: tuple = ()
_MISSING = object()


@contextlib.contextmanager
def _main_module_hidden():
    """Makes multiprocessing believe there is no main module to re-import.

    Threads may start workers at the same time (a warm start launches them in
    the background), so the first to enter hides and the last to leave restores.
    """
    global _hidden_depth, _hidden_saved
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    with _hidden_lock:
        if _hidden_depth == 0:
            _hidden_saved = (
                main,
                main.__dict__.get("__file__", _MISSING),
                main.__dict__.get("__spec__", _MISSING),
            )
            if _hidden_saved[1] is not _MISSING:
                del main.__file__
            main.__spec__ = None
        _hidden_depth += 1
    try:
        yield
    finally:
        with _hidden_lock:
            _hidden_depth -= 1
            if _hidden_depth == 0:
                saved_main, saved_file, saved_spec = _hidden_saved
                _hidden_saved = ()
                if saved_file is not _MISSING:
                    saved_main.__file__ = saved_file
                if saved_spec is _MISSING:
                    saved_main.__dict__.pop("__spec__", None)
                else:
                    saved_main.__spec__ = saved_spec


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
        # Set when workers are started from a background thread (warm start).
        self.launcher: Optional[threading.Thread] = None
        self.launched = 0
        self.launch_error: Optional[BaseException] = None

    def __call__(self) -> None:
        with self.lock:
            if self.done:
                return
            self.done = True
        launcher = self.launcher
        if launcher is not None and launcher is not threading.current_thread():
            launcher.join()  # At most one more worker start; then it sees done.
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

    Warm start: when ``next()`` has to start the workers (rather than
    ``start()`` ahead of time) and ``options.warm_start`` is set, each worker
    is started held. Until worker ``w`` reports that it has loaded its
    pipeline, the calling process computes ``w``'s outputs itself, with the
    same code and the same positions; then it tells ``w`` where to go on. The
    outputs and states are those of the workers alone; the first batch comes
    after one in-process batch instead of after a worker start.

    Args:
      pipeline: the work; worker ``w`` reads positions ``w, w + W, ...``.
      worker_count: number of worker processes (> 0).
      positions: where each worker starts and whose turn is first.
      options: buffer size per worker, profiling, warm start.
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
        # Workers started held, and the in-process outputs standing in for them.
        self._held = [False] * worker_count
        self._local: dict = {}
        self._shutdown = _Shutdown()
        self._finalizer = weakref.finalize(self, self._shutdown)
        self._closed = False

    def start(self, hold: bool = False) -> None:
        """Starts the workers; ``hold`` starts them held (see the class doc).

        Held workers are started from a background thread: starting the first
        workers of a process waits for the forkserver to boot, and the calling
        process has outputs to compute meanwhile.
        """
        if self._started:
            return
        if self._closed:
            raise RuntimeError("the worker stream is closed")
        self._started = True
        _raise_fd_limit()
        shm.sweep_orphans()
        sd = self._shutdown
        sd.prefix = f"grainlike_{os.getpid()}_{next(_stream_ids)}_{os.urandom(3).hex()}_"
        _live.add(self)
        self._held = [hold] * self._w
        launch = functools.partial(
            _launch,
            sd,
            self._payload,
            self._w,
            list(self.positions.next_positions),
            max(self._options.per_worker_buffer_size, 1),
            self._options.enable_profiling,
            hold,
            [released.append for released in self._released],
        )
        if hold:
            sd.launcher = threading.Thread(target=launch, name="grainlike-start", daemon=True)
            sd.launcher.start()
        else:
            launch()

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
            self.start(hold=self._options.warm_start)
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
            if self._local or any(self._held):
                self._release_ready()
            w = self.positions.next_worker
            if self._exhausted[w]:
                self.positions.next_worker = (w + 1) % self._w
                continue
            if self._held[w]:
                found, output = self._local_output(w)
                if found:
                    return output
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

    def _release_ready(self) -> None:
        """Lets every held worker that has loaded its pipeline go on by itself."""
        sd = self._shutdown
        if sd.launch_error is not None:
            raise sd.launch_error
        for w in range(sd.launched):
            if not self._held[w] or self._exhausted[w] or not sd.results[w].poll():
                continue
            msg = self._recv(w)
            if msg[0] == "err":  # The pipeline failed to load in the worker.
                raise _rebuild_error(w, sd.procs[w].pid, msg)
            if msg[0] != "ready":
                raise RuntimeError(f"unexpected message from held worker {w}: {msg[0]!r}")
            local = self._local.pop(w, None)
            if local is not None:
                local.close()
            sd.controls[w].send(("start", self.positions.next_positions[w]))
            self._held[w] = False

    def _local_output(self, w: int) -> tuple[bool, Any]:
        """Worker ``w``'s next output, computed here; ``(False, None)`` at its end."""
        local = self._local.get(w)
        if local is None:
            local = self._pipeline.outputs(w, self._w, self.positions.next_positions[w])
            self._local[w] = local
        try:
            position, output = next(local)
        except StopIteration:
            # As for a worker's "end": the position stays at the last output.
            del self._local[w]
            self._exhausted[w] = True
            self.positions.next_worker = (w + 1) % self._w
            return False, None
        except Exception as e:
            add_note(
                e,
                f"grainlike: raised in the calling process, which computes worker {w}'s "
                "outputs while it starts (DataLoader(warm_start=False) runs every "
                "transform in the workers)",
            )
            raise
        self.positions.next_positions[w] = position
        self.positions.next_worker = (w + 1) % self._w
        return True, output

    def close(self) -> None:
        self._closed = True
        _live.discard(self)
        for local in self._local.values():
            try:
                local.close()
            except Exception:  # Never let cleanup hide what is being raised.
                pass
        self._local.clear()
        self._finalizer()


def _launch(
    sd: _Shutdown,
    payload: bytes,
    worker_count: int,
    starts: list,
    buffer_size: int,
    profile: bool,
    hold: bool,
    on_release: list,
) -> None:
    """Starts the worker processes, registering each with ``sd`` once it runs.

    Stops early if ``sd`` is shutting down; a failure is kept in
    ``sd.launch_error`` for the consumer to raise (it may run in a thread).
    """
    ctx = _forkserver_context()
    try:
        with _main_module_hidden():
            for w in range(worker_count):
                if sd.done:
                    return
                result_r, result_w = ctx.Pipe(duplex=False)
                control_r, control_w = ctx.Pipe(duplex=False)
                proc = ctx.Process(
                    target=_worker_entry,
                    args=(
                        payload, w, worker_count, starts[w], buffer_size,
                        f"{sd.prefix}{w}_", result_w, control_r, os.getpid(), profile, hold,
                    ),
                    name=f"grainlike-worker-{w}",
                    daemon=True,
                )
                try:
                    proc.start()
                finally:
                    # Only the worker may hold these ends, so that EOF means its exit.
                    result_w.close()
                    control_r.close()
                sd.procs.append(proc)
                sd.results.append(result_r)
                sd.controls.append(control_w)
                sd.readers.append(shm.SegmentReader(on_release[w]))
                sd.launched = w + 1
    except BaseException as e:  # noqa: B902 - handed to the consumer
        if sd.launcher is None:
            raise
        sd.launch_error = e


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
