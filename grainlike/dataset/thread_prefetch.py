"""``ThreadPrefetchIterDataset``: computes an IterDataset's next elements in a thread.

The thread records the parent's state after each element, so ``get_state()`` is the
parent's state after the last element returned (grain's state, with no key added).
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Optional

from grainlike.core.errors import ClosedIteratorError
from grainlike.core.read_ahead import Prefetcher, restore, stop_holder, take
from grainlike.dataset.iter_dataset import IterDataset
from grainlike.dataset.iterator import DatasetIterator


class ThreadPrefetchDatasetIterator(DatasetIterator):
    """Runs its parent in a thread; see the module docstring.

    Args:
      parent: a ``DatasetIterator``, or any iterator with ``get_state()`` and
        ``set_state(state)``; only a ``DatasetIterator`` parent shares the pipeline's
        context, is closed with this iterator and has ``get/set_next_index``.
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
        # The running read-ahead (core.read_ahead); its thread refers to the parent
        # only, so dropping this iterator closes it (``DatasetIterator.__del__``).
        self._holder: list = [None]
        # next() and set_state() from several threads take turns; get_state()
        # and close() do not wait behind a blocked next().
        self._consumer_lock = threading.RLock()

    def start_prefetch(self) -> None:
        """Starts the thread (idempotent).

        Raises:
          ValueError: the iterator is closed.
        """
        self._assert_not_closed()
        if self._holder[0] is not None or self._buffer_size == 0:
            return
        parent = self._parent
        self._holder[0] = Prefetcher(
            parent, lambda: copy.deepcopy(parent.get_state()), None, self._buffer_size,
            owner=str(self), name=f"grainlike-thread-prefetch-{id(self):x}",
        )

    def __next__(self):
        with self._consumer_lock:
            self._assert_not_closed()
            if self._buffer_size == 0:
                element = next(self._parent)
                state = copy.deepcopy(self._parent.get_state())
            else:
                self.start_prefetch()
                try:
                    # After an end or an error, the next call asks the parent again
                    # (as a plain iterator would be asked).
                    element, state = take(self._holder)
                except ClosedIteratorError:
                    self._assert_not_closed()  # closed from another thread meanwhile
                    raise
            self._state = state
            if self._next_index is not None:
                self._next_index += 1
            return element

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
            # A state the parent refuses puts it back where this iterator was (the
            # thread had read past it).
            restore(self._holder, self._parent.set_state, state, self.get_state())
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
            stop_holder(self._holder)
            self._parent.set_state(state)
            self._next_index = self._parent._get_next_index()
        return self._next_index

    def _set_next_index(self, index: int) -> None:
        self._require_native_parent("set_next_index")
        stop_holder(self._holder)
        self._parent._set_next_index(index)
        self._next_index = index
        self._state = None

    def _close(self) -> None:
        """Stops the thread without waiting for an element in progress; closes a DatasetIterator parent."""
        stop_holder(self._holder, wait=False)
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
