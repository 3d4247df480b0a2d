"""What a Ray actor runs: one worker's slice of the pipeline, many outputs per call.

``SliceWorker`` holds worker ``w`` of ``W``'s iterator (``WorkerSliceTask.outputs``,
the code an ``mp_prefetch`` worker process runs) and hands its outputs over in
calls of ``outputs(generation, start_state, ...)``: each returns the next
outputs (at least one, up to an element, byte and time budget) with the
iterator's state after each, and whether the slice ended or failed there.

Every call names the generation of the iteration it belongs to and the state
that generation starts from: a call of a new generation (a ``set_state``, or
the pool's first call) starts the iterator afresh there, so a call never
continues an iteration it does not belong to.

Arrays travel in Ray's object store: returned by value (pickle protocol 5,
out of band), mapped without a copy by a consumer on the same node. A
``SharedMemoryArray`` (the type ``mp_prefetch`` delivers) travels as its data
and arrives as a ``SharedMemoryArray`` view of it.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import numpy as np

from grainlike.core.shared_memory_array import SharedMemoryArray
from grainlike.core.tree import estimate_nbytes


def as_plain_array(array: SharedMemoryArray) -> np.ndarray:
    """The data of ``array`` as a plain ndarray: it pickles out of band, by value (any segment stays here)."""
    return array.view(np.ndarray)


def as_shared_memory_array(array: np.ndarray) -> SharedMemoryArray:
    """A received array typed as ``mp_prefetch``'s workers deliver it (a view, no copy)."""
    return array.view(SharedMemoryArray)


class _Capture:
    """A ``connection`` for ``error_transfer.send_error`` that keeps the message."""

    def __init__(self):
        self.message: Optional[tuple] = None

    def send(self, message: tuple) -> None:
        self.message = message


class SliceWorker:
    """Worker ``worker_index`` of ``worker_count``: its slice of the pipeline (a Ray actor class).

    Args:
      payload: the pickled ``WorkerSliceTask`` (loaded at the first call, where
        a failure is reported as the worker's error).
      worker_index: ``w``.
      worker_count: ``W``.
    """

    def __init__(self, payload: bytes, worker_index: int, worker_count: int):
        import ray

        ray.util.register_serializer(
            SharedMemoryArray, serializer=as_plain_array, deserializer=as_shared_memory_array
        )
        self._payload = payload
        self._w = worker_index
        self._count = worker_count
        self._task: Any = None
        self._generation: Any = None
        self._outputs: Any = None
        self._state: Any = None  # after the last output handed over (where an error happened)
        self._end: Optional[tuple] = None
        self._where = (os.getpid(), ray.get_runtime_context().get_node_id())

    def _start(self, generation: Any, state: Any) -> None:
        if self._outputs is not None:
            outputs, self._outputs = self._outputs, None
            try:
                outputs.close()
            except Exception:  # noqa: BLE001 - the old iteration is over whatever it raises
                pass
        self._generation = generation
        self._state = state
        self._end = None

    def outputs(
        self, generation: Any, start_state: Any, max_elements: int, max_bytes: int, max_seconds: float
    ) -> tuple:
        """The next outputs of ``generation`` (started at ``start_state`` if new here).

        Returns:
          ``(states, outputs, end, where)``: the state after each output; the
          outputs; None, ``("end", state)`` after the last output, or
          ``("error", message)`` (``error_transfer.send_error``'s) where the
          iterator raised after the outputs before it; ``(pid, node id)``.
        """
        if generation != self._generation:
            self._start(generation, start_state)
        states: list = []
        outputs: list = []
        if self._end is not None:
            return states, outputs, self._end, self._where
        deadline = time.monotonic() + max_seconds
        size = 0
        try:
            if self._outputs is None:
                if self._task is None:
                    import cloudpickle

                    self._task = cloudpickle.loads(self._payload)
                self._outputs = self._task.outputs(self._w, self._count, self._state, None)
            while len(outputs) < max_elements:
                try:
                    state, output = next(self._outputs)
                except StopIteration:
                    self._outputs = None
                    self._end = ("end", self._task.end_state(self._w, self._count, self._state))
                    break
                states.append(state)
                outputs.append(output)
                self._state = state
                size += estimate_nbytes(output)
                if size >= max_bytes or time.monotonic() >= deadline:
                    break
        except Exception as e:  # noqa: BLE001 - every error of the pipeline goes to the consumer
            from grainlike.workers.error_transfer import send_error

            self._outputs = None
            capture = _Capture()
            send_error(capture, self._state, e)
            self._end = ("error", capture.message)
        return states, outputs, self._end, self._where

    def where(self) -> tuple:
        """``(pid, node id)`` of this actor's process."""
        return self._where
