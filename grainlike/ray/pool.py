"""The worker pool on Ray: one actor per worker slice, outputs taken strictly round-robin.

``RayWorkerPool`` is to ``grainlike.ray.prefetch`` what ``workers.pool.WorkerPool``
is to ``mp_prefetch``: the same task (``WorkerSliceTask``), the same
round-robin, the same bookkeeping (``states``, ``next_worker``,
``exhausted``: each changes only when an output is returned, so they are a
checkpoint at every step), another transport.

Worker ``w`` is an actor (``actor.SliceWorker``) that is sent calls, each
returning up to ``elements_per_call`` outputs with the state after each; at
most ``calls_in_flight`` calls per actor are outstanding (backpressure: the
memory in flight is bounded), and a worker's first call returns one output so
that the first element comes as soon as it is computed.

A worker whose actor dies (its process killed, its node gone, its objects
lost) is restarted, as a new actor, from its state after its last delivered
output: what it had computed and not delivered is dropped and computed again,
so every element is delivered once. A worker that dies ``_MAX_RESTARTS`` times
in a row without delivering an output raises ``WorkerDiedError``.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import uuid
import warnings
import weakref
from typing import Any, Optional, Sequence

from grainlike.core import pickling
from grainlike.core.errors import (
    ClosedIteratorError,
    ForeignWorkersError,
    WorkerDiedError,
    WorkerStalledError,
    add_note,
)
from grainlike.ray.actor import SliceWorker
from grainlike.ray.local import connect
from grainlike.ray.options import RayOptions
from grainlike.workers.error_transfer import rebuild_error

logger = logging.getLogger(__name__)

# Restarts of one worker in a row, without an output delivered in between,
# before its death is raised: a worker that dies on the same element would loop.
_MAX_RESTARTS = 3
# How often a wait for a worker looks at close() and the stall clock.
_POLL_S = 0.1
# A worker's first call also waits for Ray to place and start its actor (and to
# set up its runtime environment): it is reported stalled only after this long.
_FIRST_CALL_S = 600.0


def _failures() -> tuple:
    """Ray's errors that mean a worker's actor or its results are gone (the worker restarts)."""
    from ray import exceptions as rex

    return (
        rex.RayActorError,  # killed, crashed, its node died, or unreachable
        rex.ObjectLostError,  # its results lost with the node that held them
        rex.WorkerCrashedError,
        rex.NodeDiedError,
        rex.OutOfMemoryError,  # killed by Ray's memory monitor
    )


def _session(ray: Any) -> tuple:
    """Which Ray session this process is connected to (ids of actors repeat from one session to the next)."""
    context = ray.get_runtime_context()
    return context.gcs_address, context.get_node_id()


class _Actors:
    """The actors of a pool: worker index -> handle, and the Ray session they run in."""

    __slots__ = ("handles", "session")

    def __init__(self):
        self.handles: dict = {}
        self.session: Optional[tuple] = None


def _kill_all(actors: _Actors) -> None:
    """Kills ``actors`` and forgets them (also a finalizer: never raises)."""
    handles = list(actors.handles.values())
    actors.handles.clear()
    if not handles:
        return
    try:
        import ray

        if not ray.is_initialized() or _session(ray) != actors.session:
            return  # Their session is over: the actors went with it (an id now may name another actor).
        for handle in handles:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead, or Ray shutting down
                pass
    except Exception:  # noqa: BLE001 - a finalizer never raises
        pass


class _Worker:
    """The consumer's view of worker ``index``: its actor, its calls, its outputs not delivered yet."""

    __slots__ = ("index", "generation", "start_state", "pending", "chunk", "end", "size", "failures",
                 "failed", "where", "received", "actors", "one_by_one")

    def __init__(self, index: int, state: Any):
        self.index = index
        self.generation = 0  # of the iteration its calls belong to
        self.start_state = state  # where that iteration starts (None: the beginning)
        self.pending: collections.deque = collections.deque()  # calls sent, results not taken
        self.chunk: collections.deque = collections.deque()  # (state, output) taken, not delivered
        self.end: Optional[tuple] = None  # after the chunk: ("end", state), ("error", message), ("raised", error)
        self.size = 1  # outputs the next call asks for
        self.failures = 0  # restarts since its last delivered output
        self.failed = False  # its error was raised: exhausted at its next turn (as mp_prefetch)
        self.where: tuple = (None, None)  # (pid, node id) of its actor
        self.received = 0  # results received from its current actor
        self.actors = 0  # actors started for it
        self.one_by_one = False  # calls of one output each (to find the output that cannot be sent)

    def forget(self, generation_start: Any) -> None:
        """Drops what it computed and starts a new iteration at ``generation_start``."""
        self.generation += 1
        self.start_state = generation_start
        self.pending.clear()
        self.chunk.clear()
        self.end = None
        self.size = 1
        self.failed = False


class RayWorkerPool:
    """Outputs of ``worker_count`` Ray actors, taken strictly round-robin (``WorkerPool``'s interface).

    Args:
      task: the ``WorkerSliceTask`` every worker runs.
      worker_count: number of workers (> 0).
      states: where each worker starts (None: at the beginning).
      next_worker: whose output comes first.
      exhausted: workers that have no more outputs (no actor is started for them).
      error_ends_worker: an error raised in worker ``w`` is raised once and ``w``
        then counts as exhausted at its last delivered state (``mp_prefetch``);
        otherwise the pool stops (``broken``) and its owner starts a new one
        from ``states`` (the DataLoader).
      stall_timeout_s: a worker awaited this long without returning anything
        raises ``WorkerStalledError`` (a first call: at least ``_FIRST_CALL_S``);
        None or 0: never.
      options: where and how the actors run (``RayOptions``).
    """

    def __init__(
        self,
        task: Any,
        worker_count: int,
        states: Sequence[Any],
        next_worker: int = 0,
        *,
        exhausted: Optional[Sequence[bool]] = None,
        error_ends_worker: bool = False,
        stall_timeout_s: Optional[float] = None,
        options: RayOptions = RayOptions(),
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
        self._error_ends_worker = bool(error_ends_worker)
        self._stall_timeout_s = float(stall_timeout_s) if stall_timeout_s else None
        self._options = options
        self._workers = [_Worker(w, s) for w, s in enumerate(self.states)]
        # states / next_worker / exhausted change together under it (delivered() reads them).
        self._lock = threading.Lock()
        self._ray: Any = None
        self._actor_class: Any = None
        self._payload: Any = None  # the pickled task, in the object store
        # Every actor of this pool is named ``name_prefix + "w<index>-<n>"`` (``ray list actors``).
        self.name_prefix = f"grainlike-{uuid.uuid4().hex[:12]}-"
        # The finalizer kills what it holds.
        self._actors = _Actors()
        self._finalizer = weakref.finalize(self, _kill_all, self._actors)
        self._started = False
        self._owner_pid: Optional[int] = None  # the process that started the actors
        self._closed = False
        self.restarts = 0  # workers restarted after a failure, in all

    @property
    def broken(self) -> bool:
        """Whether the pool stopped (closed, or after an error that stops every worker)."""
        return self._closed

    @property
    def actors(self) -> dict:
        """Worker index -> the handle of its actor, for the workers that have one now."""
        return dict(self._actors.handles)

    def __iter__(self) -> "RayWorkerPool":
        return self

    # -- starting -----------------------------------------------------------------

    def start(self) -> None:
        """Connects to Ray and starts every worker that has outputs left."""
        if self._started:
            self._check_owner()
            return
        if self._closed:
            raise ClosedIteratorError("the Ray worker pool is closed")
        try:
            payload = pickling.dumps(self._task)
        except Exception as e:
            raise self._task.pickling_error(e) from e
        ray = connect(self._options.address)
        self._ray = ray
        self._owner_pid = os.getpid()
        self._payload = ray.put(payload)
        self._actors.session = _session(ray)
        self._actor_class = ray.remote(SliceWorker)
        self._started = True
        self._warn_if_short_of_cpus()
        for worker in self._workers:
            if not self.exhausted[worker.index]:
                self._send_calls(worker)

    def _check_owner(self) -> None:
        if self._owner_pid != os.getpid():
            raise ForeignWorkersError(
                f"this iterator's Ray actors belong to process {self._owner_pid}; process "
                f"{os.getpid()} is a fork of it, which cannot use its Ray connection. In the "
                "child, create a new iterator (then set_state() to continue from a position)."
            )

    def _warn_if_short_of_cpus(self) -> None:
        cpus = self._options.actor_kwargs().get("num_cpus") or 0
        need = cpus * sum(not e for e in self.exhausted)
        have = self._ray.cluster_resources().get("CPU", 0)
        if need > have:
            warnings.warn(
                f"grainlike.ray: {self._w} workers of {cpus} CPU each need {need:g} CPUs; the "
                f"Ray cluster has {have:g}, so some workers wait for CPUs to be freed or added. "
                "Pass actor_options={'num_cpus': ...} with less per worker, fewer workers, "
                "or add nodes.",
                RuntimeWarning,
                stacklevel=4,
            )

    def _actor(self, worker: _Worker) -> Any:
        """Worker ``worker``'s actor, started now if it has none."""
        handle = self._actors.handles.get(worker.index)
        if handle is None:
            worker.actors += 1
            worker.received = 0
            name = f"{self.name_prefix}w{worker.index}-{worker.actors}"
            options = {**self._options.actor_kwargs(), "name": name, "max_restarts": 0, "max_task_retries": 0}
            handle = self._actor_class.options(**options).remote(self._payload, worker.index, self._w)
            self._actors.handles[worker.index] = handle
        return handle

    def _send_calls(self, worker: _Worker) -> None:
        """Sends calls to ``worker`` until ``calls_in_flight`` are outstanding (none once it ended)."""
        if worker.end is not None or self._closed:
            return
        options = self._options
        while len(worker.pending) < options.calls_in_flight:
            actor = self._actor(worker)
            ref = actor.outputs.remote(
                worker.generation,
                worker.start_state,
                1 if worker.one_by_one else worker.size,
                options.bytes_per_call,
                options.seconds_per_call,
            )
            worker.pending.append(ref)
            worker.size = min(worker.size * 2, options.elements_per_call)

    def _stop_actor(self, worker: _Worker) -> None:
        handle = self._actors.handles.pop(worker.index, None)
        if handle is not None:
            one = _Actors()
            one.handles[worker.index], one.session = handle, self._actors.session
            _kill_all(one)

    # -- outputs -------------------------------------------------------------------

    def delivered(self) -> tuple[list, int, list]:
        """``(states, next_worker, exhausted)`` after the last delivered output, from any thread."""
        with self._lock:
            return list(self.states), self.next_worker, list(self.exhausted)

    def __next__(self) -> Any:
        if self._closed:
            raise self._closed_error(self.next_worker)
        self.start()
        while True:
            w = self.next_worker
            worker = self._workers[w]
            if worker.failed:
                # As mp_prefetch: after its error a worker is exhausted at its last delivered state.
                worker.failed = False
                with self._lock:
                    self.exhausted[w] = True
            if all(self.exhausted):
                raise StopIteration
            if self.exhausted[w]:
                with self._lock:
                    self.next_worker = (w + 1) % self._w
                continue
            if worker.chunk:
                state, output = worker.chunk.popleft()
                with self._lock:
                    self.states[w] = state
                    self.next_worker = (w + 1) % self._w
                worker.failures = 0
                return output
            if worker.end is not None:
                self._finish(worker)
                continue
            self._receive(worker)

    def _finish(self, worker: _Worker) -> None:
        """Worker ``worker`` has delivered everything it computed: it ended, or raises its error."""
        w = worker.index
        kind, what = worker.end
        if kind == "end":
            with self._lock:
                self.exhausted[w] = True
                self.states[w] = what
                self.next_worker = (w + 1) % self._w
            self._stop_actor(worker)  # Its CPU goes back to the cluster.
            return
        if kind == "error":
            pid, node = worker.where
            error = rebuild_error(w, pid, what)
            add_note(error, f"grainlike: worker {w} of {self._w} ran as a Ray actor on node {node}")
        else:
            error = what
        self._stop_actor(worker)
        if self._error_ends_worker:
            worker.end = None
            worker.failed = True
            raise error
        self.close()
        raise error

    def _receive(self, worker: _Worker) -> None:
        """Takes the result of ``worker``'s oldest call into its chunk (or restarts it if it died)."""
        if not worker.pending:
            self._send_calls(worker)
        ref = worker.pending[0]
        limit = self._stall_timeout_s
        if limit and not worker.received:
            limit = max(limit, _FIRST_CALL_S)
        started = time.monotonic()
        ray = self._ray
        while True:
            if self._closed:
                raise self._closed_error(worker.index)
            ready, _ = ray.wait([ref], timeout=_POLL_S)
            if ready:
                break
            if limit and time.monotonic() - started > limit:
                raise self._stalled(worker, time.monotonic() - started)
        worker.pending.popleft()
        try:
            states, outputs, end, where = ray.get(ref)
        except _failures() as e:
            if self._closed:
                raise self._closed_error(worker.index) from None
            self._restart(worker, e)
            return
        except ray.exceptions.RayTaskError as e:
            # Not the pipeline's error (the actor reports those itself): its
            # results could not be sent (an output that cannot be pickled, say).
            if not worker.one_by_one:
                # The outputs of that call before the culprit are delivered first, as
                # mp_prefetch does: the worker goes again from its last delivered
                # output, one output per call, up to the failing one.
                worker.one_by_one = True
                worker.forget(self.states[worker.index])
                self._send_calls(worker)
                return
            cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else e
            add_note(
                cause,
                f"grainlike: Ray worker {worker.index} of {self._w} failed to return its outputs; "
                "outputs crossing processes must be picklable",
            )
            worker.pending.clear()
            worker.end = ("raised", cause)
            return
        except ray.exceptions.RayError:
            # Ray could not run the worker at all (its runtime environment failed to
            # set up, it cannot be scheduled): the next next() starts every worker again.
            self.close()
            raise
        worker.received += 1
        worker.where = where
        worker.chunk.extend(zip(states, outputs))
        if end is not None:
            worker.end = end
            worker.pending.clear()  # Later calls return the same end.
        else:
            self._send_calls(worker)

    def _restart(self, worker: _Worker, error: BaseException) -> None:
        """Starts ``worker`` again, as a new actor, from its last delivered output."""
        w = worker.index
        worker.failures += 1
        state = self.states[w]
        if worker.failures > _MAX_RESTARTS:
            pid, node = worker.where
            self.close()
            raise WorkerDiedError(
                f"Worker process was terminated unexpectedly: grainlike's Ray worker {w} of {self._w} "
                f"(last on node {node}, pid {pid}) died {worker.failures} times in a row without "
                f"delivering an output, the last time with {type(error).__name__}: {error}. Its state "
                f"after its last delivered output: {state!r}; get_state() is that position, and "
                "next() starts every worker again from there."
            ) from error
        self.restarts += 1
        logger.warning(
            "grainlike.ray: worker %d of %d (node %s, pid %s) failed (%s: %s); restarting it from "
            "its state after its last delivered output: %r",
            w, self._w, worker.where[1], worker.where[0], type(error).__name__, str(error).splitlines()[0] if str(error) else "", state,
        )
        self._stop_actor(worker)
        worker.forget(state)
        self._send_calls(worker)

    def _stalled(self, worker: _Worker, waited: float) -> WorkerStalledError:
        w = worker.index
        pid, node = worker.where
        started = "" if worker.received else " (its actor may not have started: see `ray status` for resources)"
        self.close()
        return WorkerStalledError(
            f"grainlike's Ray worker {w} of {self._w} (node {node}, pid {pid}) returned nothing for "
            f"{waited:.0f} s{started}; its state after its last delivered output: {self.states[w]!r}. "
            "next() starts every worker again from there; stall_timeout_s=None turns the check off."
        )

    def _closed_error(self, w: int) -> ClosedIteratorError:
        return ClosedIteratorError(
            "the Ray worker pool was closed (by close(), before this call or from another "
            f"thread during it) while next() waited for worker {w} of {self._w}; the iterator "
            "keeps the state of its last delivered output"
        )

    # -- set_state and close ---------------------------------------------------------

    def reset(self, states: Sequence[Any], next_worker: int, exhausted: Sequence[bool]) -> bool:
        """Moves the workers to new states in the same actors (what they computed ahead is dropped).

        Returns:
          False if the pool has not started or is closed (the caller starts a new one).
        """
        if not self._started or self._closed:
            return False
        if len(states) != self._w or len(exhausted) != self._w:
            raise ValueError(
                f"expected {self._w} worker states and exhausted flags, got {len(states)} and {len(exhausted)}"
            )
        with self._lock:
            self.states = list(states)
            self.next_worker = next_worker
            self.exhausted = [bool(e) for e in exhausted]
        for worker in self._workers:
            worker.forget(self.states[worker.index])
            worker.failures = 0
            if not self.exhausted[worker.index]:
                self._send_calls(worker)
        return True

    def close(self, dropped: bool = False) -> None:
        """Kills the actors and drops their results. Idempotent.

        Arrays already returned stay valid for as long as they are referenced.
        ``dropped`` is ``WorkerPool.close``'s; killing actors never waits.
        """
        self._closed = True
        for worker in self._workers:
            worker.pending.clear()
            worker.chunk.clear()
        self._payload = None
        self._finalizer()
