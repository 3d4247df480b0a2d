"""The worker pool: processes that each compute one worker's share of a task.

``messages``: the task and the messages; ``frames``: how outputs travel in
them; ``pool``: ``WorkerPool``, with ``receiving`` (a message received in
steps) and ``warm_start`` (a held worker's outputs computed in the caller);
``start``: how a worker process starts (fork, the worker server of ``server``
and ``server_loop``, spawn; the process classes of ``worker_process``);
``main``: a worker's main loop; ``guards``: what the user's code in a worker
may not do to it (exit unreported, fork a second worker); ``shm``: batch leaves handed over in
shared memory; ``liveness``: a stalled or dead worker noticed and described;
``error_transfer``: an exception raised in a worker raised in the consumer;
``shutdown``: stopping the workers and releasing what they hold.

Importing this package loads none of them: ``import grainlike`` loads only
``server`` (it boots the worker server early).
"""
