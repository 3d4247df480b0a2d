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
import threading
import time
import weakref
from typing import Any, Optional, Sequence

from grainlike.core import memfd
from grainlike.core.protocols import ClosesOnExit
from grainlike.core.errors import (
    ClosedIteratorError,
    WorkerDiedError,
    WorkerStalledError,
    _WorkerFailed,
    add_note,
)
from grainlike.workers import frames, server, shm
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
    foreign_error,
    malformed_error,
)
from grainlike.workers.messages import END, ERR, EXIT, OUT, OUTS, RESET, WorkerTask
from grainlike.workers.receiving import (
    PartialMessage,
    Pollers,
    ReceiveFailed,
    Receiving,
    Stream,
    kept_note,
    send_tick,
)
from grainlike.workers.shutdown import JOIN_TIMEOUT_S, Shutdown, live_pools, quietly, stop_in_background, stop_process
from grainlike.workers.start import launch, pickle_task
from grainlike.workers.warm_start import WarmStart


# Forks of this process so far, as seen in each child: a pool started before
# the latest one is another process's (``_check_owner`` without a getpid per output).
_FORKS = [0]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _FORKS.__setitem__(0, _FORKS[0] + 1))


class WorkerPool(Receiving, WarmStart, ClosesOnExit):
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
        # Where set, the record of w's last output, whose state (states[w]) is unpickled when asked for.
        self._raw: list = [None] * worker_count
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
        # position it started from; _writes is odd while an output taken from
        # the inbox (which never waits) is recorded.
        self._calls = 0
        self._writes = 0
        self._call_start: tuple = ()
        self._forks = -1  # _FORKS when started.
        self._payload, shipped = pickle_task(task)
        self._started = False
        self._released = [collections.deque() for _ in range(worker_count)]
        # Per worker, (frame, record offset, build) of an OUTS frame's outputs not yet returned.
        self._inbox = [collections.deque() for _ in range(worker_count)]
        # Per worker, the layouts its frames defined (``frames.parse``).
        self._layouts: list = [{} for _ in range(worker_count)]
        # Per worker, a message read whose reception here failed part way (``_message``).
        self._partial: list = [None] * worker_count
        self._waited = -1  # The worker whose message _plain_out waited for in vain.
        self._pollers = Pollers(worker_count)  # Per worker, a poll of its socket and exit.
        self._streams = [Stream() for _ in range(worker_count)]  # Per worker, its results as read.
        # Per worker, the reset whose RESET_DONE is still to come (its messages until then are stale).
        self._resetting: list = [None] * worker_count
        self._resets = 0
        # Workers started held (_holding: any), and the in-process outputs standing in for them.
        self._held = [False] * worker_count
        self._holding = False
        self._local: dict = {}
        self._shutdown = Shutdown()
        self._shutdown.shipped = shipped
        self._finalizer = weakref.finalize(self, self._shutdown)
        self._closed = False

    @property
    def states(self) -> list:
        """Each worker's state after its last delivered output (at first, where it starts)."""
        raw = self._raw
        for w, r in enumerate(raw):
            if r is not None:
                self._states[w] = frames.state(*r)
                raw[w] = None
        return self._states

    @states.setter
    def states(self, states: Sequence[Any]) -> None:
        self._states = list(states)
        self._raw = [None] * self._w

    def _restore(self, position: tuple) -> None:
        self._states, self._raw, self.next_worker, self.exhausted = position

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
        self._forks = _FORKS[0]
        shm.raise_fd_limit()
        sd = self._shutdown
        if memfd.available():
            sd.progress = Progress(self._w)
        live_pools.add(self)
        server.install_exit_on_signals()
        self._held = [hold and not e for e in self.exhausted]
        self._holding = any(self._held)
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

    _poll_ms = int(POLL_S * 1000)  # How long a wait for a worker lasts between looks at it (``_recv``).

    def _look(self, w: int, watch: Optional[StallWatch]) -> StallWatch:
        """Looks at worker ``w``, awaited for another ``POLL_S``: raises if it stalled (``liveness``)."""
        if watch is None:
            watch = StallWatch(self._shutdown.progress, w)
        check_progress(self._shutdown, w, self._w, self.states[w], self._stall_timeout_s, watch, self._then)
        return watch

    def _tick(self, w: int) -> None:
        ticks = self._shutdown.ticks  # (Emptied when the pool closes.)
        if w < len(ticks):
            send_tick(ticks[w], self._released[w])

    def _died_error(self, w: int) -> WorkerDiedError:
        """The error for worker ``w``, whose pipe shows that its process is gone."""
        return died_error(self._shutdown.procs[w], w, self._w, self.states[w], self._then())

    def _check_owner(self) -> None:
        owner = self._shutdown.owner_pid
        if self._started and owner != os.getpid():
            raise foreign_error(self.pids, owner)

    def delivered(self) -> tuple[list, int, list]:
        """``(states, next_worker, exhausted)`` after the last delivered output, from any thread.

        Does not wait for a ``next()`` running in another thread: while one runs,
        the position it started from is returned. Calls of ``next()`` must not overlap.
        """
        while True:
            calls, writes = self._calls, self._writes
            if writes % 2:  # Between two assignments of an output from the inbox.
                time.sleep(0)
                continue
            if calls % 2:
                states, raw, next_worker, exhausted = self._call_start
            else:
                states, raw, next_worker, exhausted = self._states, self._raw, self.next_worker, self.exhausted
            states, raw, exhausted = list(states), list(raw), list(exhausted)
            if self._calls == calls and self._writes == writes:
                return [s if r is None else frames.state(*r) for s, r in zip(states, raw)], next_worker, exhausted

    def __next__(self) -> Any:
        # The commonest calls first, from a pool this process owns: the next
        # output is in the inbox (OUTS; nothing here waits or can fail half way),
        # or the next message is an OUT of a known layout.
        w = self.next_worker
        inbox = self._inbox[w]
        if self._dead is None and self._forks == _FORKS[0]:
            if inbox:
                entry = inbox[0]
                try:
                    output = entry[2](entry[0], entry[1], None)
                except Exception:  # noqa: BLE001 - (entry[2] None too) the full path below raises it
                    pass
                else:
                    inbox.popleft()
                    self._writes += 1
                    self._raw[w] = entry
                    self.next_worker = (w + 1) % self._w
                    self._writes += 1
                    return output
            elif (  # Its next message is simply to be received: nothing started, held, ended, failed or reset.
                self._partial[w] is None
                and self._started
                and not (self._closed or self.exhausted[w] or self._failed[w] or self._holding or self._local)
                and self._resetting[w] is None
            ):
                output = self._plain_out(w)
                if output is not None:
                    return output
        if self._forks != _FORKS[0]:  # (Not started, or this process is a fork.)
            self._check_owner()
        # The position before this call, taken before anything changes it midway (an
        # end, a worker skipped): until then delivered() sees it as it is, and an
        # output is recorded as in the inbox path.
        before = None
        # The ends this call took in (a worker's END, or its error raised before):
        # (w, the END message, or None). Rewound with the position should a later
        # message fail to be received, they are taken in again by the next call.
        ended: list = []
        try:
            if not self._started:  # (start() does nothing once started.)
                self.start(hold=self._warm_start)
            while True:
                if self._dead is not None:  # With error_ends_worker: raised by every next().
                    w, error = self._dead
                    raise _WorkerFailed(type(error)(
                        f"this iterator cannot go on without the remaining outputs of grainlike worker "
                        f"{w} of {self._w} (pid {self._shutdown.procs[w].pid}), as raised before: {error}"
                    ))
                w = self.next_worker
                if self.exhausted[w] or self._failed[w] or self._holding or self._local or self._resetting[w] is not None:
                    if all(self.exhausted):
                        raise StopIteration
                    if before is None:
                        before = self._call_start = (list(self._states), list(self._raw), w, list(self.exhausted))
                        self._calls += 1
                    if self._local or self._holding:
                        self._release_ready()
                    if self._failed[w]:
                        # As grain: after its error a worker is exhausted at its last delivered state.
                        self._failed[w] = False
                        self.exhausted[w] = True
                        ended.append((w, None))
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
                    entry = inbox[0]
                    try:
                        output = frames.output(entry[0], entry[1], self._layouts[w])
                    except frames.Malformed as e:
                        raise self._malformed(w, e) from None
                    inbox.popleft()
                else:
                    msg, output = self._message(w)
                    kind = msg[0]
                    if kind == OUTS:  # Small outputs travelling together (main._Outbox): one credit.
                        inbox.extend(frames.entries(msg[1], msg[2], self._layouts[w]))
                        self._tick(w)
                        continue
                    if kind != OUT:
                        if before is None:
                            before = self._call_start = (list(self._states), list(self._raw), w, list(self.exhausted))
                            self._calls += 1
                        self._other_message(w, msg)
                        if kind == END:
                            ended.append((w, msg))
                        continue
                    self._tick(w)
                    entry = (msg[1], msg[2][0])
                self._writes += 1
                self._raw[w] = entry
                self.next_worker = (w + 1) % self._w
                self._writes += 1
                return output
        except StopIteration:
            raise
        except _WorkerFailed as failed:
            raise failed.error from None
        except ReceiveFailed as failed:
            # Nothing was delivered and the workers go on: the next call receives the same output.
            if before is not None:
                self._restore(before)
                # The ends taken in before it were read off their sockets: kept, so that
                # the next call takes them in again (else it would wait for such a worker).
                for w, msg in ended:
                    if msg is None:
                        self._failed[w] = True
                    else:
                        part = self._partial[w] = PartialMessage(b"")
                        part.msg = msg
            raise failed.error from None
        except BaseException:
            if not self._closed:
                # Interrupted half way (a message half read, or taken but not
                # returned): the owner restarts the workers from the last output returned.
                if before is not None:
                    self._restore(before)
                self.close()
            raise
        finally:
            if before is not None:
                self._calls += 1

    def _plain_out(self, w: int) -> Any:
        """Worker ``w``'s next output, if its next message, read now, is a plain ``OUT`` or an ``OUTS``; else None.

        Any other message is kept for the full path (``_partial``), as is one
        that fails to parse; nothing waited for longer than ``POLL_S`` (then the
        full path looks at the worker first). An error making an output ends
        the pool, as in the full path.
        """
        sd = self._shutdown
        fd = sd.results[w]._handle  # (fileno() less its two calls; None once closed.)
        raw = None
        if fd is not None:
            try:
                raw = self._streams[w].read(fd)
            except (EOFError, OSError):
                pass  # The full path reads again, and reports how.
            except BaseException:  # (Ctrl-C within a message: the stream's position is lost.)
                self.close()
                raise
        if raw is None:
            self._waited = w
            return None
        try:
            output = frames.plain_out(raw, self._layouts[w], sd.readers[w])
        except BaseException as e:
            error = self._malformed(w, e) if isinstance(e, frames.Malformed) else None
            self.close()
            if error is not None:
                raise error from None
            raise
        if output is not None:
            ticks = sd.ticks  # (As _tick.)
            if w < len(ticks):
                send_tick(ticks[w], self._released[w])
            self._writes += 1
            self._raw[w] = (raw, frames.PLAIN_OUT_AT)
            self.next_worker = (w + 1) % self._w
            self._writes += 1
            return output
        part = self._partial[w] = PartialMessage(raw)
        try:
            part.msg = frames.message(raw, self._layouts[w])
        except frames.Malformed as e:
            error = self._malformed(w, e)
            self.close()
            raise error from None
        except Exception as e:  # As the full path: kept, for the next call.
            add_note(e, kept_note(w))
            raise
        if part.msg[0] != OUTS:
            return None
        self._partial[w] = None
        inbox = self._inbox[w]
        inbox.extend(frames.entries(raw, part.msg[2], self._layouts[w]))
        self._tick(w)
        entry = inbox[0]
        try:
            output = entry[2](entry[0], entry[1], None)
        except Exception:  # noqa: BLE001 - (entry[2] None too) the full path raises it
            return None
        inbox.popleft()
        self._writes += 1
        self._raw[w] = entry
        self.next_worker = (w + 1) % self._w
        self._writes += 1
        return output

    def _other_message(self, w: int, msg: tuple) -> None:
        """Handles worker ``w``'s message that is no output: its end, or raises its error."""
        kind = msg[0]
        if kind == END:
            self.exhausted[w] = True
            self.states[w] = msg[1]
            self._advance(w)
            return
        if kind == ERR:
            raise self._failure(w, rebuild_error(w, self._shutdown.procs[w].pid, msg))
        if kind == EXIT:
            raise self._failure(w, exit_error(self._shutdown.procs[w].pid, w, self._w, self.states[w], msg, self._then()))
        raise RuntimeError(f"unexpected message from worker {w}: {kind!r}")

    def _advance(self, w: int) -> None:
        self.next_worker = (w + 1) % self._w

    def _malformed(self, w: int, error: BaseException) -> RuntimeError:
        return malformed_error(self._shutdown.procs[w].pid, w, self._w, error)

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
        position = (list(states), [None] * self._w, next_worker, [bool(e) for e in exhausted])
        # delivered() from another thread sees the new position throughout.
        self._call_start = position
        self._calls += 1
        try:
            for w in range(self._w):
                try:
                    sd.controls[w].send((RESET, self._resets, position[0][w], position[3][w]))
                except (OSError, ValueError):  # It died: the caller starts new workers.
                    self.close()
                    return False
                self._resetting[w] = self._resets
                self._inbox[w].clear()  # (A half-received message is drained as stale.)
            self._restore(position)
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

