"""The messages between a worker pool (``pool``) and its workers (``main``), and the task they run.

``WorkerTask`` is the work a pool runs. A message is a tuple whose first item
is its tag, defined here once. Tags are short strings: pickling an enum member
costs ~6 µs more per message (``ForkingPickler.dumps`` + ``pickle.loads`` of a
4-item message: 4.7 against 10.4 µs), paid for each message.

From a worker, on its results socket (each message length-prefixed, as
``Connection.send_bytes`` frames it):

- ``OUT``: one output, as a frame (``frames``: not a pickle) with its state
  and the segments it is the first to use, ``[(seg_id, size)]``, whose
  descriptors follow on the worker's control socket (``shm.send_fds``). Takes
  one credit. Delivered as ``(OUT, frame, [record offset], new_segments)``.
- ``OUTS``: small outputs travelling together, as one frame of several
  records. Takes one credit. Delivered as ``(OUTS, frame, record offsets, [])``.
- ``END``: ``(END, state)``, the worker has no more outputs.
- ``ERR``: ``(ERR, state, ...)``, an error (``error_transfer.send_error``).
- ``EXIT``: ``(EXIT, state, code, what, where, notes, stack)``, the user's code
  ended the worker (``what``: ``sys.exit(3)``, ``os._exit(1)``,
  ``KeyboardInterrupt``; ``where``: the user's frame; ``notes``: the
  exception's, naming the transform and element; ``stack``: the traceback).
  The process then exits with ``code``; the consumer raises ``WorkerDiedError``
  (``guards.exit_report``).
- ``READY``: ``(READY,)``, a held worker has loaded its task.
- ``RESET_DONE``: ``(RESET_DONE, epoch)``, the worker dropped everything it
  computed from before the ``RESET`` numbered ``epoch`` and goes on from that
  reset's state: every message before it is stale.

From the consumer, on a worker's tick pipe (not pickled: ``receiving.send_tick``):

- a tick, ``count, ids...`` (u32 each): the consumer took a message (one
  more may be sent), and these segments may be reused. Nothing waits on the
  pipe while the worker computes (``receiving.Credits``).

On a worker's control socket (pickled):

- ``START``: ``(START, state)``, a held worker goes on from ``state``.
- ``RESET``: ``(RESET, epoch, state, exhausted)``, the worker drops what it
  computed and goes on from ``state`` (None: a fresh start), or idles if
  ``exhausted``; answered by ``RESET_DONE``.
- ``STOP``: ``(STOP,)``, the worker exits.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Protocol, runtime_checkable

from grainlike.core.tree import Allocator


# From a worker.
OUT = "out"
OUTS = "outs"
END = "end"
ERR = "err"
EXIT = "exit"
READY = "ready"
RESET_DONE = "reset_done"
# From the consumer.
START = "start"
RESET = "reset"
STOP = "stop"


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
      >>> from grainlike.workers.pool import WorkerPool
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

    # A task may also be ``DescribesOutputs`` and ``Interruptible`` (below).


@runtime_checkable
class DescribesOutputs(Protocol):
    """A task that names where its outputs came from, for the error of an output that cannot be pickled."""

    def describe_output(self, worker_index: int, worker_count: int, before: Any, after: Any) -> str:
        """A sentence naming the records and the transform of the output between states ``before`` and ``after``."""


@runtime_checkable
class Interruptible(Protocol):
    """A task whose work in ``outputs`` (its reads, say) another thread can end at once."""

    def interrupt(self) -> None:
        """Called from another thread of the worker when it is told to stop."""
