"""The worker pool: processes that each compute one worker's share of a task.

A task is any picklable ``WorkerTask`` (``messages``; ``mp_prefetch``'s for the
Dataset API and the DataLoader alike). Worker ``w`` of ``W`` starts at a state
and yields ``(state after this output, output)``; the pool takes the outputs
strictly round-robin and keeps every worker's state after its last delivered
output, which is all a checkpoint needs. Nothing the consumer does waits on a
worker without a bound, so ``close()`` from another thread ends a blocked ``next()``.
"""

from __future__ import annotations

import collections
import functools
import os
import pickle
import threading
import weakref
from typing import Any, Callable, Optional, Sequence

from multiprocessing.reduction import ForkingPickler

from grainlike.core import memfd
from grainlike.core.protocols import ClosesOnExit
from grainlike.core.errors import (
    ClosedIteratorError,
    ForeignWorkersError,
    WorkerDiedError,
    WorkerStalledError,
    _WorkerFailed,
    add_note,
)
from grainlike.workers import server, shm
from grainlike.workers.error_transfer import rebuild_error
from grainlike.workers.liveness import (
    after_failure,
    closed_error,
    DEFAULT_STALL_TIMEOUT_S,
    POLL_S,
    Progress,
    StallWatch,
    check_progress,
    died_error,
    exit_error,
    exited,
)
from grainlike.workers.messages import END, ERR, EXIT, OUT, OUTS, READY, RESET, RESET_DONE, START, WorkerTask
from grainlike.workers.receiving import PartialMessage, Pollers, ReceiveFailed, map_segments, read_bytes, send_tick
from grainlike.workers.shutdown import JOIN_TIMEOUT_S, Shutdown, live_pools, quietly, stop_in_background, stop_process
from grainlike.workers.start import launch, pickle_task


_POLL_MS = int(POLL_S * 1000)


class WorkerPool(ClosesOnExit):
    """Outputs of ``worker_count`` worker processes, taken strictly round-robin.

    ``states[w]`` is worker ``w``'s state after its last delivered output (at
    first, where it starts) and ``next_worker`` whose turn is next; both change
    only when an output is returned, so they are a checkpoint at every step.

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
      error_ends_worker: an error raised in worker ``w`` is raised once, and
        ``w`` then counts as exhausted at its last delivered state while the
        others go on (grain's ``mp_prefetch``); its death or stall is raised by
        every later ``next()``, its outputs being lost. Otherwise every error
        stops all workers and the pool is ``broken``; its owner starts a new
        one from ``states`` (the DataLoader).
      stall_timeout_s: a worker awaited for this long without making progress
        raises ``WorkerStalledError`` (``liveness``); None or 0: never.
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
        # With error_ends_worker: (w, error) of the worker that died or stalled.
        self._dead: Optional[tuple[int, BaseException]] = None
        # For delivered() from other threads: odd while a next() runs, and the
        # position it started from.
        self._calls = 0
        self._call_start: tuple = ()
        self._payload, shipped = pickle_task(task)
        self._started = False
        self._released = [collections.deque() for _ in range(worker_count)]
        # Per worker, the pickled (state, output)s of an OUTS message not yet returned.
        self._inbox = [collections.deque() for _ in range(worker_count)]
        # Per worker, a message read whose reception here failed part way (``_message``).
        self._partial: list = [None] * worker_count
        # Per worker, ((socket fd, sentinel), select.poll) waiting on both (``_poller``).
        self._pollers = Pollers(worker_count)
        # Per worker, the reset whose RESET_DONE is still to come (its messages until then are stale).
        self._resetting: list = [None] * worker_count
        self._resets = 0
        # Workers started held, and the in-process outputs standing in for them.
        self._held = [False] * worker_count
        self._local: dict = {}
        self._shutdown = Shutdown()
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

    def start(self, hold: bool = False) -> None:
        """Starts the workers; ``hold`` starts them held (see the class doc), from a background thread.

        The first workers of a process may wait for the worker server to boot,
        and the calling process has held workers' outputs to compute meanwhile.
        """
        self._check_owner()
        if self._started:
            return
        if self._closed:
            raise ClosedIteratorError("the worker pool is closed")
        self._started = True
        self._shutdown.owner_pid = os.getpid()
        shm.raise_fd_limit()
        sd = self._shutdown
        if memfd.available():
            sd.progress = Progress(self._w)
        live_pools.add(self)
        server.install_exit_on_signals()
        self._held = [hold and not e for e in self.exhausted]
        start_workers = functools.partial(
            launch,
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
            sd.launcher = threading.Thread(target=start_workers, name="grainlike-start", daemon=True)
            sd.launcher.start()
        else:
            start_workers()

    def _then(self) -> str:
        """What happens to the pool after a worker failed."""
        return after_failure(self._error_ends_worker)

    def _closed_error(self, w: int) -> ClosedIteratorError:
        return closed_error(w, self._w)

    def _recv(self, w: int, read: Callable[[Any], Any]) -> Any:
        """``read(connection)`` of worker ``w``'s socket once it is readable, watching for close(), its exit and its progress."""
        sd = self._shutdown
        conn = sd.results[w]
        if not self._closed:
            # The common case when workers keep up: a message is waiting. One
            # poll(2) of the socket, rather than a selector and a stall watch per message.
            try:
                conn_fd = conn.fileno()
                # (Connection.poll() would build a selector.)
                ready = any(fd == conn_fd for fd, _ in self._pollers.get(w, conn_fd, sd.procs[w].sentinel).poll(0))
            except (OSError, ValueError):
                ready = False  # Closed from another thread: the loop below reports it.
            if ready:
                try:
                    return read(conn)
                except EOFError:
                    pass  # The worker is gone: the loop below reports how.
                except (OSError, ValueError, IndexError):
                    if self._closed:
                        raise self._closed_error(w) from None
                    raise
        proc = sd.procs[w]
        watch = StallWatch(sd.progress, w)
        while True:
            if self._closed:
                raise self._closed_error(w)
            try:
                conn_fd = conn.fileno()
                ready = self._pollers.get(w, conn_fd, proc.sentinel).poll(_POLL_MS)
                if not ready:
                    check_progress(sd, w, self._w, self.states[w], self._stall_timeout_s, watch, self._then)
                    continue
                if any(fd == conn_fd for fd, _ in ready) or conn.poll():
                    try:
                        return read(conn)
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
        return died_error(self._shutdown.procs[w], w, self._w, self.states[w], self._then())

    def _tick(self, w: int) -> None:
        released = self._released[w]
        ids = []
        while released:
            ids.append(released.popleft())
        send_tick(self._shutdown.controls[w], ids)

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

        Does not wait for a ``next()`` running in another thread: while one runs,
        the position it started from is returned. Calls of ``next()`` must not overlap.
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
            if not self._started:  # (start() does nothing once started.)
                self.start(hold=self._warm_start)
            return self._next_output()
        except StopIteration:
            raise
        except _WorkerFailed as failed:
            raise failed.error from None
        except ReceiveFailed as failed:
            # Nothing was delivered and the workers go on: the next call receives the same output.
            self.states, self.next_worker, self.exhausted = before
            raise failed.error from None
        except BaseException:
            if not self._closed:
                # Interrupted half way (a message half read, or taken but not
                # returned): the owner restarts the workers from the last output returned.
                self.states, self.next_worker, self.exhausted = before
                self.close()
            raise
        finally:
            self._calls += 1

    def _advance(self, w: int) -> None:
        self.next_worker = (w + 1) % self._w

    def _next_output(self) -> Any:
        while True:
            if self._dead is not None:  # With error_ends_worker: raised by every next().
                w, error = self._dead
                raise _WorkerFailed(type(error)(
                    f"this iterator cannot go on without the remaining outputs of grainlike worker "
                    f"{w} of {self._w} (pid {self._shutdown.procs[w].pid}), as raised before: {error}"
                ))
            if all(self.exhausted):
                raise StopIteration
            if self._local or any(self._held):
                self._release_ready()
            w = self.next_worker
            if self._failed[w]:
                # As grain: after its error a worker is exhausted at its last delivered state.
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
            msg, output = self._message(w)
            kind = msg[0]
            if kind == OUT:
                self.states[w] = msg[1]
                self._advance(w)
                self._tick(w)
                return output
            if kind == OUTS:  # Small outputs, each pickled on its own (main._Outbox): one credit.
                inbox.extend(msg[1])
                self._tick(w)
                continue
            if kind == END:
                self.exhausted[w] = True
                self.states[w] = msg[1]
                self._advance(w)
                continue
            if kind == ERR:
                raise self._failure(w, rebuild_error(w, self._shutdown.procs[w].pid, msg))
            if kind == EXIT:
                raise self._failure(w, exit_error(self._shutdown.procs[w].pid, w, self._w, self.states[w], msg, self._then()))
            raise RuntimeError(f"unexpected message from worker {w}: {kind!r}")

    def _message(self, w: int) -> tuple:
        """Worker ``w``'s next message, fully received: ``(message, output)`` (an ``OUT``'s output, else None).

        Receiving takes steps in this process: reading the bytes, unpickling
        them, receiving and mapping an ``OUT``'s new segments, making its arrays.
        A failure after the bytes were read and before the arrays are made
        (``MemoryError``, a mapping refused under memory pressure) keeps the
        message half received and raises ``ReceiveFailed``: the next call goes
        on from the step that failed, so the output is neither lost nor repeated
        and no worker counts as ended. A failure while reading the bytes or
        making the arrays leaves the stream or the segments in an unknown state:
        it is raised as it is, and the pool's owner restarts the workers from
        the last delivered outputs.
        """
        part = self._partial[w]
        try:
            if part is None:
                part = PartialMessage(self._recv(w, read_bytes))
                self._partial[w] = part
            if part.msg is None:
                part.msg = ForkingPickler.loads(part.raw)
            msg = part.msg
            output = None
            if msg[0] == OUT:
                if msg[3] and part.fds is None:
                    # New segments: their descriptors follow the message.
                    self._partial[w] = None  # (A failure receiving them breaks the stream.)
                    part.fds = self._recv(w, functools.partial(shm.recv_fds, count=len(msg[3])))
                    self._partial[w] = part
                if part.fds:
                    map_segments(self._shutdown.readers[w], msg[3], part.fds)
                    part.close_fds()
                self._partial[w] = None  # (A failure making the arrays may have released segments.)
                output = self._shutdown.readers[w].materialize(msg[2])
        except WorkerDiedError as e:
            raise self._failure(w, e) from None
        except WorkerStalledError as e:
            raise self._failure(w, e, responsive=False) from None
        except _WorkerFailed:
            raise
        except Exception as e:
            if self._partial[w] is None or self._closed:
                raise
            add_note(
                e,
                f"grainlike: this process failed receiving an output of worker {w} (its "
                "bytes are kept here); nothing was delivered, and the next next() "
                "receives the same output again",
            )
            raise ReceiveFailed(e) from None
        self._partial[w] = None
        return msg, output

    def _drain_stale(self, w: int) -> None:
        """Drops worker ``w``'s messages from before its latest reset, up to its ``RESET_DONE``.

        Outputs are dropped as if delivered (their segments and credits go back),
        an end, an error or an exit report is ignored; a death or stall is reported as ever.
        """
        while self._resetting[w] is not None:
            msg, output = self._message(w)
            del output  # Let go at once: the segments are released.
            kind = msg[0]
            if kind in (OUT, OUTS):
                self._tick(w)
            elif kind == RESET_DONE and msg[1] == self._resetting[w]:
                self._resetting[w] = None

    def reset(self, states: Sequence[Any], next_worker: int, exhausted: Sequence[bool]) -> bool:
        """Moves the running workers to new states without restarting them (grain's set_state).

        Each worker is sent ``RESET`` with its state; what it computed before is
        dropped as it arrives (``_drain_stale``). An exhausted worker idles until a later reset.

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
            or any(exited(p) for p in sd.procs)
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
                except (OSError, ValueError):  # It died: the caller starts new workers.
                    self.close()
                    return False
                self._resetting[w] = self._resets
                self._inbox[w].clear()  # (A half-received message is drained as stale.)
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
                stop_process(self._shutdown.procs[w], None, ask=False)
            self.close()
            return error
        sd = self._shutdown
        if isinstance(error, (WorkerDiedError, WorkerStalledError)):
            self._dead = (w, error)
        else:
            self._failed[w] = True
        stop_process(sd.procs[w], sd.controls[w], ask=responsive)
        return _WorkerFailed(error)

    def _release_ready(self) -> None:
        """Lets every held worker that has loaded its task go on by itself."""
        sd = self._shutdown
        if sd.launch_error is not None:
            raise sd.launch_error
        for w in range(sd.launched):
            if not self._held[w] or self.exhausted[w] or self._failed[w] or not sd.results[w].poll():
                continue
            msg, _ = self._message(w)
            if msg[0] == ERR:  # The task failed to load in the worker.
                raise self._failure(w, rebuild_error(w, sd.procs[w].pid, msg))
            if msg[0] == EXIT:
                raise self._failure(w, exit_error(self._shutdown.procs[w].pid, w, self._w, self.states[w], msg, self._then()))
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
        except SystemExit as e:  # It would end worker w's process (see main), not the caller's.
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
            terminated after 0.03 s rather than 2 s, from a background thread
            (exit waits for it), and the caller (a finalizer) returns at once.
        """
        self._closed = True
        live_pools.discard(self)
        for w, part in enumerate(self._partial):
            if part is not None:
                self._partial[w] = None
                quietly(part.close_fds)
        for local in self._local.values():
            quietly(local.close)  # Never let cleanup hide what is being raised.
        self._local.clear()
        if self._finalizer.detach() is None:
            return
        if dropped:
            stop_in_background(self._shutdown)
        else:
            self._shutdown(JOIN_TIMEOUT_S)

