"""The messages between a worker pool (``pool``) and its workers (``main``), and the task they run.

``WorkerTask`` is the work a pool runs. A message is a tuple whose first item
is its tag, defined here once. Tags are short strings: pickling an enum member
costs ~6 µs more per message (``ForkingPickler.dumps`` + ``pickle.loads`` of a
4-item message: 4.7 against 10.4 µs), paid twice per output.

From a worker, on its results socket:

- ``OUT``: ``(OUT, state, output, new_segments)``, one output; after it, when
  ``new_segments`` (``[(seg_id, size)]``) is not empty, those segments'
  descriptors (``shm.send_fds``). Takes one credit.
- ``OUTS``: ``(OUTS, [pickled (state, output), ...])``, small outputs
  travelling together. Takes one credit.
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

From the consumer, on a worker's control pipe:

- ``TICK``: ``(TICK, released_segment_ids)``, the consumer took a message:
  one more may be sent, and these segments may be reused.
- ``START``: ``(START, state)``, a held worker goes on from ``state``.
- ``RESET``: ``(RESET, epoch, state, exhausted)``, the worker drops what it
  computed and goes on from ``state`` (None: a fresh start), or idles if
  ``exhausted``; answered by ``RESET_DONE``.
- ``STOP``: ``(STOP,)``, the worker exits.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Protocol

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
TICK = "tick"
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

    # Optional: ``describe_output(worker_index, worker_count, state_before,
    # state_after) -> str``, a sentence naming the records and the transform an
    # output came from, for the error raised when the output cannot be pickled;
    # ``interrupt()``, called from another thread when the worker is told to
    # stop, to end the work ``outputs`` is doing (e.g. its reads) at once.
