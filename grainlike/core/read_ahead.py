"""The one read-ahead thread of grainlike, which remembers the wrapped iterator's state after each item.

Each item comes with that state, so the owner's ``get_state()`` is where the owner
is, not where the thread is. The owner keeps the ``Prefetcher`` in a one-element
list (its "holder"); a ``weakref.finalize`` of the owner calls
``stop_holder(holder, wait=False)``, so the thread holds no reference to its owner
and stops once its current read returns. Standard library only.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Iterator, Optional

from grainlike.core.errors import ClosedIteratorError
from grainlike.core.protocols import Checkpointable, missing_state_methods

BATCH, END, ERROR = "batch", "end", "error"


class Prefetcher:
    """The background thread and its buffer; holds no reference to its owner.

    Args:
      source: the iterator read ahead of.
      get_state: called after each item for the state stored beside it; None
        stores None.
      convert: applied to each item in the thread (e.g. the copy to the device);
        None hands items over as they are.
      size: items kept ready.
      owner: the name of the owner's type, for the error of a read after
        ``stop()``.
      name: the thread's name.
    """

    def __init__(self, source: Iterator[Any], get_state: Optional[Callable[[], Any]],
                 convert: Optional[Callable[[Any], Any]], size: int, owner: str = "DeviceIterator",
                 name: str = "grainlike-device-prefetch"):
        self._source = source
        self._get_state = get_state
        self._convert = convert
        self._size = size
        self._owner = owner
        self._items: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cv:
                while len(self._items) >= self._size and not self._stopped:
                    self._cv.wait()
                if self._stopped:
                    return
            try:
                batch = next(self._source)
                state = self._get_state() if self._get_state is not None else None
                item = (BATCH, batch if self._convert is None else self._convert(batch), state)
            except StopIteration:
                item = (END, None, None)
            except BaseException as e:  # handed to the consumer, raised there
                item = (ERROR, e, None)
            with self._cv:
                if self._stopped:
                    return
                self._items.append(item)
                self._cv.notify_all()
            if item[0] is not BATCH:
                return

    def get(self) -> tuple:
        """The next ``(kind, value, state)``: kind is BATCH, END or ERROR (value is the exception)."""
        with self._cv:
            while not self._items:
                if self._stopped:
                    raise ClosedIteratorError(f"{self._owner} is closed")
                self._cv.wait()
            item = self._items.popleft()
            self._cv.notify_all()
            return item

    def stop(self, wait: bool = True) -> None:
        """Stops the thread; with ``wait``, returns once it no longer uses the source."""
        with self._cv:
            self._stopped = True
            self._items.clear()
            self._cv.notify_all()
        # The thread may be inside next(source); that returns, then the thread sees
        # the flag. Never join from the thread itself (a finalizer could run there).
        if wait and self._thread is not threading.current_thread():
            self._thread.join()


def stop_holder(holder: list, wait: bool = True) -> None:
    """Stops and forgets the prefetcher in ``holder[0]``, if any.

    ``wait``: until the thread no longer uses the wrapped iterator (before the owner
    restores or closes it); a finalizer passes False, as it must not block.
    """
    prefetcher, holder[0] = holder[0], None
    if prefetcher is not None:
        prefetcher.stop(wait)


def take(holder: list) -> tuple[Any, Any]:
    """The next item and the wrapped iterator's state after it, from the prefetcher in ``holder[0]``.

    Raises:
      StopIteration: the wrapped iterator has ended.
      Exception: whatever the wrapped iterator or the conversion raised.
      Either way the thread is removed from ``holder``: a later read starts a new
      one, which asks the wrapped iterator again.
    """
    kind, value, state = holder[0].get()
    if kind is BATCH:
        return value, state
    stop_holder(holder)
    if kind is END:
        raise StopIteration
    raise value


def checkpointable(iterator: Any, owner: str) -> Checkpointable:
    """``iterator``, whose state ``owner`` saves and restores.

    Raises:
      TypeError: ``iterator`` is not ``Checkpointable``.
    """
    if not isinstance(iterator, Checkpointable):
        raise TypeError(
            f"the wrapped {type(iterator).__name__} has no {missing_state_methods(iterator)}; "
            f"{owner} saves and restores the state of iterators that do (iter(DataLoader))"
        )
    return iterator


def restore(holder: list, set_state: Callable[[Any], None], state: Any, previous: Any) -> None:
    """Stops the read-ahead in ``holder``, then ``set_state(state)`` on the wrapped iterator.

    Raises:
      Exception: whatever ``set_state(state)`` raises, after putting the wrapped
        iterator back at ``previous`` (the caller's position, which the thread had
        read past), so that an invalid state changes nothing.
    """
    stop_holder(holder)
    try:
        set_state(state)
    except BaseException:
        set_state(previous)
        raise
