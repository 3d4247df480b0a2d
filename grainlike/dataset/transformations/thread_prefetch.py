"""``ThreadPrefetchIterDataset``: computes an IterDataset's next elements in a thread.

The thread records the parent's state after each element, so ``get_state()`` is the
parent's state after the last element returned (grain's state, with no key added).
"""

from __future__ import annotations

import copy
from typing import Any, Optional

from grainlike.core.errors import ClosedIteratorError
from grainlike.core.read_ahead import ReadAhead
from grainlike.dataset.nodes.element_spec import parent_element_spec
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator


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

    # A prefetch node of grain's execution statistics, counting the bytes it hands over.
    _STATS_PREFETCH = True
    _STATS_RECORDS_BYTES = True

    def __init__(self, parent: Any, prefetch_buffer_size: int):
        if isinstance(parent, DatasetIterator):
            super().__init__(parent)
            self._native_parent = True
        else:
            super().__init__()
            self._parent = parent
            self._native_parent = False
        self._buffer_size = prefetch_buffer_size
        self._next_index: Optional[int] = 0
        # Its thread refers to the parent only, so dropping this iterator closes it
        # (``DatasetIterator.__del__``). get_state() and close() do not wait behind a
        # blocked next().
        self._ahead = ReadAhead(
            parent, prefetch_buffer_size, str(self), get_state=lambda: copy.deepcopy(parent.get_state()),
            keep_state=True, name=f"grainlike-thread-prefetch-{id(self):x}",
        )

    def start_prefetch(self) -> None:
        """Starts the thread (idempotent).

        Raises:
          ValueError: the iterator is closed.
        """
        self._assert_not_closed()
        if self._buffer_size:
            self._ahead.start_prefetch()

    def __next__(self):
        with self._ahead.lock:
            self._assert_not_closed()
            try:
                element = next(self._ahead)
            except ClosedIteratorError:
                self._assert_not_closed()  # closed from another thread meanwhile
                raise
            if self._next_index is not None:
                self._next_index += 1
            return element

    def get_state(self) -> dict:
        return self._ahead.get_state()

    def set_state(self, state: dict) -> None:
        self._ahead.set_state(state)
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
            self._ahead.set_state(self.get_state())  # The parent back where the user is (the thread read past it).
            self._next_index = self._parent._get_next_index()
        return self._next_index

    def _set_next_index(self, index: int) -> None:
        self._require_native_parent("set_next_index")
        self._ahead.reposition(lambda: self._parent._set_next_index(index))
        self._next_index = index

    def _close(self) -> None:
        """Stops the thread without waiting for an element in progress; closes a DatasetIterator parent."""
        self._ahead.stop()
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

    _element_spec = parent_element_spec

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
