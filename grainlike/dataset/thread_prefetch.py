"""``ThreadPrefetchIterDataset``: computes an IterDataset's next elements in a thread.

One background thread runs the parent iterator up to ``prefetch_buffer_size``
elements ahead of the consumer and records the parent's state after each element,
so ``get_state()`` is exactly the state after the last element returned (grain's
state: the parent's own, with no key added).
"""

from __future__ import annotations

import copy
import queue
import threading
from typing import Any, Optional

from grainlike.core.errors import InvalidStateError
from grainlike.dataset.base import DatasetIterator, IterDataset

# How often a thread waiting for room in a full buffer looks at its stop flag
# (stopping also empties the buffer, which wakes it at once).
_POLL_S = 0.1


def _put(buffer: queue.Queue, item: tuple, stop: threading.Event) -> bool:
    """Puts ``item`` once there is room; False (and drops it) if stopped first."""
    while not stop.is_set():
        try:
            buffer.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            pass
    return False


def _produce(parent: DatasetIterator, buffer: queue.Queue, stop: threading.Event) -> None:
    """Puts ``(element, state, None)`` per element, then ``(None, None, error)``.

    A function, not a method: the thread refers to the parent, the buffer and the
    flag only, so dropping the iterator closes it (``DatasetIterator.__del__``).
    """
    try:
        while not stop.is_set():
            element = next(parent)
            if not _put(buffer, (element, copy.deepcopy(parent.get_state()), None), stop):
                return
    except Exception as e:  # StopIteration included: the consumer raises it in turn.
        _put(buffer, (None, None, e), stop)


class ThreadPrefetchDatasetIterator(DatasetIterator):
    """Runs its parent in a thread; see the module docstring.

    Args:
      parent: a ``DatasetIterator``, or any iterator with ``get_state()`` and
        ``set_state(state)`` (grain's ``CheckpointableIterator``). Only a
        ``DatasetIterator`` parent shares the pipeline's context, is closed with
        this iterator and supports ``get_next_index`` / ``set_next_index``.
      prefetch_buffer_size: elements computed ahead (0: none, no thread).

    Example:
      >>> class Counter:
      ...     def __init__(self):
      ...         self.n = 0
      ...     def __iter__(self):
      ...         return self
      ...     def __next__(self):
      ...         if self.n == 3:
      ...             raise StopIteration
      ...         self.n += 1
      ...         return self.n
      ...     def get_state(self):
      ...         return {"n": self.n}
      ...     def set_state(self, state):
      ...         self.n = state["n"]
      >>> it = ThreadPrefetchDatasetIterator(Counter(), prefetch_buffer_size=2)
      >>> next(it), it.get_state(), list(it)
      (1, {'n': 1}, [2, 3])
    """

    def __init__(self, parent: Any, prefetch_buffer_size: int):
        if isinstance(parent, DatasetIterator):
            super().__init__(parent)
            self._native_parent = True
        else:
            super().__init__()
            self._parent = parent
            self._native_parent = False
        self._buffer_size = prefetch_buffer_size
        self._state: Optional[dict] = parent.get_state()
        self._next_index: Optional[int] = 0
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._buffer: queue.Queue = queue.Queue(maxsize=prefetch_buffer_size)
        # next() and set_state() from several threads take turns; get_state()
        # and close() do not wait behind a blocked next().
        self._consumer_lock = threading.RLock()

    def start_prefetch(self) -> None:
        """Starts the thread (idempotent).

        Raises:
          ValueError: the iterator is closed.
        """
        self._assert_not_closed()
        if self._thread is not None or self._buffer_size == 0:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=_produce,
            args=(self._parent, self._buffer, self._stop),
            daemon=True,
            name=f"grainlike-thread-prefetch-{id(self):x}",
        )
        self._thread.start()

    def __next__(self):
        with self._consumer_lock:
            self._assert_not_closed()
            if self._buffer_size > 0:
                self.start_prefetch()
                element, state, error = self._take()
            else:
                element = next(self._parent)
                state, error = copy.deepcopy(self._parent.get_state()), None
            if error is not None:
                self._stop_thread(join=True)
                if isinstance(error, StopIteration):
                    # A later next() asks the parent again (as a plain iterator
                    # would be asked), so every thread waiting here sees the end.
                    error = StopIteration()
                raise error
            self._state = state
            if self._next_index is not None:
                self._next_index += 1
            return element

    def _take(self) -> tuple:
        """The next buffered item; ends if ``close()`` is called from another thread meanwhile."""
        buffer = self._buffer
        while True:
            try:
                return buffer.get(timeout=_POLL_S)
            except queue.Empty:
                self._assert_not_closed()

    def _clear(self) -> None:
        while True:
            try:
                self._buffer.get_nowait()
            except queue.Empty:
                return

    def _stop_thread(self, join: bool) -> None:
        """Stops the thread; with ``join``, waits until it no longer uses the parent."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        self._clear()  # Unblocks a put() on a full buffer.
        if join:
            thread.join()
            self._clear()
        else:
            # The thread ends after its current next(); a fresh buffer keeps its
            # last put() from reaching a later thread.
            self._buffer = queue.Queue(maxsize=self._buffer_size)
        self._thread = None

    def get_state(self) -> dict:
        state = self._state  # Replaced whole after each element: consistent from any thread.
        if state is None:
            with self._consumer_lock:
                if self._state is None:
                    self._state = self._parent.get_state()
                state = self._state
        return state

    def set_state(self, state: dict) -> None:
        with self._consumer_lock:
            self._set_state(state)

    def _set_state(self, state: dict) -> None:
        previous = self.get_state()
        self._stop_thread(join=True)
        try:
            self._parent.set_state(state)
        except InvalidStateError:
            # The parent refused before changing, but it is past what the thread read
            # ahead: back to where this iterator was.
            self._parent.set_state(previous)
            raise
        self._state = self._parent.get_state()
        self._next_index = None

    def _require_native_parent(self, what: str) -> None:
        if not self._native_parent:
            raise ValueError(
                f"`{what}` only supported for native dataset iterators. {self}: its parent "
                f"{type(self._parent).__name__} is not a DatasetIterator, and has no index"
            )

    def _get_next_index(self) -> int:
        if self._next_index is None:
            self._require_native_parent("_get_next_index")
            state = self.get_state()
            self._stop_thread(join=True)
            self._parent.set_state(state)
            self._next_index = self._parent._get_next_index()
        return self._next_index

    def _set_next_index(self, index: int) -> None:
        self._require_native_parent("set_next_index")
        self._stop_thread(join=True)
        self._parent._set_next_index(index)
        self._next_index = index
        self._state = None

    def close(self) -> None:
        """Stops the thread without waiting for an element in progress; closes a DatasetIterator parent."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._stop_thread(join=False)
        if self._native_parent:
            self._parent.close()

    def __str__(self) -> str:
        return f"ThreadPrefetchDatasetIterator(prefetch_buffer_size={self._buffer_size})"


class ThreadPrefetchIterDataset(IterDataset):
    """Computes up to ``prefetch_buffer_size`` elements of ``parent`` ahead, in a thread.

    With ``prefetch_buffer_size=0`` it computes nothing ahead.

    Example:
      >>> from grainlike.dataset import MapDataset
      >>> ds = MapDataset.range(4).to_iter_dataset().map(lambda x: x * 2)
      >>> list(ThreadPrefetchIterDataset(ds, prefetch_buffer_size=2))
      [0, 2, 4, 6]

    Raises:
      ValueError: ``prefetch_buffer_size < 0``.
    """

    def __init__(self, parent: IterDataset, *, prefetch_buffer_size: int):
        super().__init__(parent)
        if prefetch_buffer_size < 0:
            raise ValueError(
                f"`prefetch_buffer_size` must be greater than or equal to 0, got {prefetch_buffer_size}."
            )
        self._prefetch_buffer_size = prefetch_buffer_size

    def __iter__(self) -> DatasetIterator:
        return ThreadPrefetchDatasetIterator(self._parent.__iter__(), self._prefetch_buffer_size)

    def __str__(self) -> str:
        return f"ThreadPrefetchIterDataset(prefetch_buffer_size={self._prefetch_buffer_size})"
