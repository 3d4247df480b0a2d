"""The one read-ahead thread of grainlike, and ``ReadAhead``, which reports the user's position, not the thread's.

``Prefetcher`` reads a wrapped iterator in a background thread and stores, beside
each item, the wrapped iterator's state read right after it. ``ReadAhead`` wraps
an iterator with one ``Prefetcher`` (or none: ``prefetch=0`` reads in ``next()``)
and owns everything about reading ahead of the user: the state after the last
item delivered, restoring (with roll-back), closing from another thread, and
stopping the thread when nobody holds the iterator. ``DeviceIterator``,
``InJitIterator``, ``ThreadPrefetchDatasetIterator`` and the builder's loader
iterators are made of it. Standard library only.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any, Callable, Iterator, Optional

from grainlike.core.errors import ClosedIteratorError
from grainlike.core.protocols import (
    Checkpointable, ClosesOnExit, Prefetching, close_if_closeable, missing_state_methods,
)

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



class ReadAhead(ClosesOnExit, Iterator[Any]):
    """Reads a wrapped iterator ahead of its user in one thread; ``get_state()`` is where the user is.

    The state reported is the wrapped iterator's state right after the last item
    delivered (``next()``, or ``deliver``), read by the thread after each item;
    while nothing is read ahead, the wrapped iterator's own. The thread holds no
    reference to this object: it stops when this is closed or dropped (without
    waiting then), and it is not started again once closed.

    Args:
      wrapped: the iterator whose state this reports and restores, and which
        ``close()`` closes.
      prefetch: items kept ready by the thread; 0 reads in ``next()``, with no thread.
      owner: the name errors give, e.g. ``"DeviceIterator is closed"``.
      items: what is read, if not ``wrapped`` itself (e.g. stacks of its items).
      convert: applied to each item as it is read, in the thread when there is one.
      get_state: reads the wrapped state (default: ``wrapped.get_state``, when
        ``wrapped`` is ``Checkpointable``).
      keep_state: False: when no thread has read past the user (``prefetch=0``,
        after the end or an error), the state is asked of the wrapped iterator,
        which is then where the user is. True: the state is the one after the last
        delivered item even then (grain's ``ThreadPrefetchDatasetIterator``): what
        was read when the end or an error came (a part of a stack, say) counts
        as not delivered.
      name: the thread's name.
    """

    def __init__(self, wrapped: Any, prefetch: int, owner: str, *, items: Optional[Iterator[Any]] = None,
                 convert: Optional[Callable[[Any], Any]] = None, get_state: Optional[Callable[[], Any]] = None,
                 keep_state: bool = False, name: str = "grainlike-device-prefetch"):
        self._iterator = wrapped  # (the name core.state_files follows through wrappers)
        self._items = wrapped if items is None else items
        self._prefetch = prefetch
        self._owner = owner
        self._convert = convert
        self._get_state = get_state or (wrapped.get_state if isinstance(wrapped, Checkpointable) else None)
        self._keep_state = keep_state
        self._name = name
        # next(), read() and set_state() take turns; get_state() and close() do not wait.
        self.lock = threading.RLock()
        # The wrapped state after the last delivered item; None: not read past the
        # user, so the wrapped iterator's own. Replaced whole, read without the lock.
        self._state: Any = None
        self._peeked: Optional[tuple] = None  # (item, state) read by peek(), not delivered
        self._closed = False
        # The finalizer owns the running Prefetcher, so the thread stops when this
        # is dropped or at exit, without a reference cycle; the wrapped iterator is
        # not closed then (someone else may hold it).
        self._holder: list = [None]
        self._finalizer = weakref.finalize(self, stop_holder, self._holder, wait=False)

    def __next__(self) -> Any:
        with self.lock:
            item, self._state = self.read()
            return item

    def _remember(self) -> None:
        """Before reading past the user, notes where they are."""
        if self._state is None and self._get_state is not None:
            self._state = self._get_state()

    def _start(self) -> Prefetcher:
        """The running thread; started (after noting the user's position) if none runs."""
        if self._closed:
            raise ClosedIteratorError(f"{self._owner} is closed")
        prefetcher = self._holder[0]
        if prefetcher is None:
            self._remember()
            prefetcher = self._holder[0] = Prefetcher(
                self._items, self._get_state, self._convert, self._prefetch, self._owner, self._name
            )
            if self._closed:  # by close() in another thread meanwhile: get() raises
                stop_holder(self._holder, wait=False)
        return prefetcher

    def read(self) -> tuple:
        """The next item and the wrapped state after it, not yet delivered (``deliver`` does).

        Raises:
          ClosedIteratorError: closed (also while waiting, from another thread).
          StopIteration: the wrapped iterator has ended.
          Exception: what reading or ``convert`` raised. After this or the end,
            a later read asks the wrapped iterator again (a new thread).
        """
        with self.lock:
            if self._closed:
                raise ClosedIteratorError(f"{self._owner} is closed")
            if self._peeked is not None:
                item, self._peeked = self._peeked, None
                return item
            if self._prefetch == 0:
                if self._keep_state:
                    self._remember()
                item = next(self._items)
                item = item if self._convert is None else self._convert(item)
                return item, self._get_state() if self._keep_state and self._get_state is not None else None
            kind, value, state = self._start().get()
            if kind is BATCH:
                return value, state
            stop_holder(self._holder)  # The thread has ended.
            if not self._keep_state:
                self._state = None  # Nothing is read ahead: the wrapped iterator is where the user is.
            if kind is END:
                raise StopIteration
            raise value

    def peek(self) -> Any:
        """The item the next ``read()`` returns, read now (e.g. to learn its shapes); not delivered."""
        with self.lock:
            if self._peeked is None:
                self._remember()
                self._peeked = self.read()
            return self._peeked[0]

    def deliver(self, state: Any) -> None:
        """Records that the item ``read()`` returned with ``state`` has reached the user."""
        self._state = state

    def start_prefetch(self) -> None:
        """Starts reading ahead now (e.g. while a model restores); with ``prefetch=0``, asks the wrapped iterator to."""
        with self.lock:
            if self._prefetch:
                self._start()
            elif isinstance(self._iterator, Prefetching):
                self._iterator.start_prefetch()

    def _not_checkpointable(self) -> TypeError:
        return TypeError(
            f"the wrapped {type(self._iterator).__name__} has no {missing_state_methods(self._iterator)}; "
            f"{self._owner} saves and restores the state of iterators that do (iter(DataLoader))"
        )

    def get_state(self) -> Any:
        """The wrapped iterator's state right after the last item delivered.

        From another thread it does not wait behind a blocked ``next()``.

        Raises:
          TypeError: the wrapped iterator has no ``get_state()/set_state()``.
        """
        if self._get_state is None:
            raise self._not_checkpointable()
        state = self._state
        if state is None:
            state = self._get_state()
            # A thread started meanwhile: the position noted before it started is the user's.
            if self._state is not None:
                state = self._state
        return state

    def set_state(self, state: Any) -> None:
        """Restores the wrapped iterator; what was read ahead is dropped.

        Raises:
          TypeError: the wrapped iterator has no ``get_state()/set_state()``.
          Exception: what the wrapped ``set_state`` raises (``InvalidStateError``
            for a state of another pipeline), the position unchanged.
        """
        self.reposition(lambda: self._iterator.set_state(state))

    def reposition(self, move: Callable[[], Any]) -> None:
        """Stops the thread, drops what was read ahead, then ``move()`` moves the wrapped iterator.

        Raises:
          TypeError: the wrapped iterator is not ``Checkpointable``.
          Exception: what ``move()`` raises, once the wrapped iterator is back at
            the user's position if it was read past (a ``set_state`` that refuses
            a state changes nothing itself).
        """
        with self.lock:
            if not isinstance(self._iterator, Checkpointable):
                raise self._not_checkpointable()
            previous = self._state  # None: not read past the user
            stop_holder(self._holder)
            self._peeked = None
            try:
                move()
            except BaseException:
                if previous is not None:
                    self._iterator.set_state(previous)
                raise
            self._state = None

    def stop(self) -> None:
        """Stops reading ahead for good, without waiting for the thread; the wrapped iterator stays open.

        A ``next()`` waiting for an item, and every later one, raises ``ClosedIteratorError``.
        """
        self._closed = True
        stop_holder(self._holder, wait=False)

    def close(self) -> None:
        """Stops the thread and closes the wrapped iterator. Idempotent.

        From another thread it ends a blocked ``next()`` first, without waiting for it.
        """
        self._closed = True  # From here on, a thread that starts stops itself (_start).
        prefetcher = self._holder[0]
        self.stop()  # Wakes a next() waiting for an item.
        close_if_closeable(self._iterator)  # Ends one waiting in the wrapped iterator (workers).
        if prefetcher is not None:
            prefetcher.stop()  # Returns once its thread has ended.

    def __str__(self) -> str:
        return f"{type(self).__name__}({self._iterator})"
