"""The tags of the messages between a worker pool (``workers``) and its workers (``worker_main``).

A message is a tuple whose first item is its tag. Each tag is defined here once;
both sides import it.

From a worker, on its results socket:

- ``OUT``: ``(OUT, state, output, new_segments)``, one output; after it, when
  ``new_segments`` (``[(seg_id, size)]``) is not empty, those segments'
  descriptors (``shm.send_fds``). Takes one credit.
- ``OUTS``: ``(OUTS, [pickled (state, output), ...])``, small outputs
  travelling together. Takes one credit.
- ``END``: ``(END, state)``, the worker has no more outputs.
- ``ERR``: ``(ERR, state, ...)``, an error (``worker_main._send_error``).
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

OUT = "out"
OUTS = "outs"
END = "end"
ERR = "err"
READY = "ready"
RESET_DONE = "reset_done"

TICK = "tick"
START = "start"
RESET = "reset"
STOP = "stop"
