"""``MapDataset.to_iter_dataset()``: iterating a MapDataset in chunks, read ahead in threads.

The iterator reads consecutive indices in chunks through ``_getitems``, so every
stage below it handles a list of elements per call and the source gets one batched
read per chunk. Chunks start at one element (the first element is not delayed) and
double up to a cap that also keeps a chunk near ``_CHUNK_BYTES``.

With read threads (``num_threads > 0`` and ``prefetch_buffer_size > 0``), chunks are
read ahead in a thread pool, up to about ``prefetch_buffer_size`` elements in
flight; the output order is the same as without threads. Each element of a chunk
read in a thread is taken as soon as it is computed (``MapDataset._iter_items``):
it does not wait for a slower element after it in its chunk (grain computes one
element per thread, so an element whose successor never finishes is delivered
there too). Without ``ReadOptions``,
threads are used when some work under the iterator waits (``read_threads.py``):
decided from the options and the stages' and sources' types, never from timings.

The state is grain's: ``{"next_index": n}``, the index of the next element read.
After a restore on another number of ``mp_prefetch`` workers it also names the
positions delivered before the restore, which the iterator does not deliver
again (``skipped_positions.SkippingReader``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import weakref
from typing import Any, Optional

import numpy as np

from grainlike.core import monitoring, tree
from grainlike.core.errors import ClosedIteratorError, StateIndexError
from grainlike.dataset.nodes import worker_slice
from grainlike.dataset.nodes.element_spec import parent_element_spec
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.nodes.map_dataset import MapDataset
from grainlike.dataset.nodes.skipped_positions import SkippingReader
from grainlike.dataset.transformations.filter import WINDOW, FilterThresholdChecker
from grainlike.dataset.nodes.options import ReadOptions
from grainlike.dataset.transformations.chunk import Chunk
from grainlike.dataset.transformations.read_threads import pipeline_waits
from grainlike.dataset.nodes.state import non_negative_int, require_keys

# Chunks never exceed this many elements, nor about this many bytes.
_MAX_CHUNK = 256
_CHUNK_BYTES = 8 << 20
# With threads, one read task holds at most this many elements, and about this
# many bytes: when the iterator is dropped, closed or restarted, the tasks not yet
# started are cancelled and those running (at most num_threads of them) finish,
# so these bound the work done after that (grain's: one element per thread).
MAX_THREAD_CHUNK = 8
_THREAD_CHUNK_BYTES = 1 << 20
_NOTHING: frozenset = frozenset()


class PrefetchIterDataset(IterDataset):
    """Iterates over a MapDataset in index order, skipping ``None`` unless allowed.

    Args:
      parent: the MapDataset.
      read_options: explicit ``ReadOptions`` are honoured as given. None means
        grain's defaults where some work under it waits (a remote or user
        source, a user map), and no threads where all of it is known to be
        local and CPU-bound (``read_threads.pipeline_waits``).
      allow_nones: also yield the ``None`` of filtered-out elements.
    """

    _element_spec = parent_element_spec

    def __init__(self, parent: MapDataset, *, read_options: Optional[ReadOptions] = None, allow_nones: bool = False):
        super().__init__(parent)
        if read_options is not None and not isinstance(read_options, ReadOptions):
            # grain's ReadOptions (or any object with the same two fields).
            try:
                read_options = ReadOptions(
                    num_threads=read_options.num_threads,
                    prefetch_buffer_size=read_options.prefetch_buffer_size,
                )
            except AttributeError:
                raise TypeError(f"read_options must be a ReadOptions, got {read_options!r}") from None
        self._explicit = read_options is not None
        self._read_options = read_options or ReadOptions()
        self._allow_nones = allow_nones

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Reads only the indices of ``sl`` (a worker's share), in place.

        Only for a copy of the pipeline made for one worker (see
        ``worker_slice.copy_stages``). With ``sequential_slice`` the sources
        above are cut to the worker's contiguous range instead (see
        ``grainlike.dataset.nodes.worker_slice``).

        Raises:
          ValueError: ``sequential_slice`` and a source above cannot be sliced.
        """
        if sequential_slice:
            worker_slice.set_slice(self._parent, sl, sequential_slice=True)
            return
        self._parents = (self._parent.slice(sl),)

    @property
    def read_options(self) -> ReadOptions:
        return self._read_options

    def read_threads(self) -> int:
        """The read threads the iterator will use (0: read in the calling thread)."""
        options = self._read_options
        if options.num_threads == 0 or options.prefetch_buffer_size == 0:
            return 0
        if not self._explicit and not pipeline_waits(self._parent):
            return 0
        return options.num_threads

    def __str__(self) -> str:
        return f"PrefetchIterDataset(read_options={self._read_options}, allow_nones={self._allow_nones})"

    def __iter__(self) -> "PrefetchDatasetIterator":
        threads = self.read_threads()
        cls = _ThreadedPrefetchDatasetIterator if threads else PrefetchDatasetIterator
        return cls(self._parent, self._read_options, self._allow_nones, threads)


class NextIndexState:
    """The state of a stage reading positions ``0 .. _length`` in order: grain's ``{"next_index": n}``.

    The stage keeps ``_next_index`` (the next position it delivers from) and
    ``_length``, and moves with ``_restart_at(index)``.
    """

    _next_index: int
    _length: int

    def _restart_at(self, index: int) -> None:
        raise NotImplementedError

    def get_state(self) -> dict:
        return {"next_index": self._next_index}

    def set_state(self, state: dict) -> None:
        """Moves to ``state["next_index"]``, in ``[0, len]``.

        Raises:
          StateIndexError: the index is out of range (an ``IndexError``, with
            grain's message first).
          StateTypeError: it is not an int; StateKeyError: it is missing.
        """
        require_keys(state, self, ("next_index",))
        index = state["next_index"]
        if isinstance(index, (int, np.integer)) and not isinstance(index, bool) and not 0 <= index <= self._length:
            raise StateIndexError(
                f"Checkpoint `next_index` {index} is out of range for dataset of length "
                f"{self._length}. {self}: state['next_index'] must be in [0, {self._length}]"
            )
        self._restart_at(non_negative_int(state, "next_index", self, upper=self._length))

    def _get_next_index(self) -> int:
        return self._next_index

    def _set_next_index(self, index: int) -> None:
        self.set_state({"next_index": index})


def _values(parent: MapDataset, start: int, stop: int, skip: frozenset) -> Any:
    """Elements ``[start, stop)`` of ``parent`` as ``_iter_items`` computes them; None at the positions of ``skip``, not read."""
    if not skip:
        return parent._iter_items(range(start, stop))
    values = iter(parent._iter_items([i for i in range(start, stop) if i not in skip]))
    return (None if i in skip else next(values) for i in range(start, stop))


def _read(parent: MapDataset, start: int, stop: int, skip: frozenset = frozenset()) -> tuple[list, Optional[BaseException]]:
    """Elements ``[start, stop)`` of ``parent`` (None at ``skip``); on an error, those before it and the error.

    A function of the dataset, not a method of the iterator: a read task in a
    thread must not keep the iterator alive.
    """
    try:
        if skip:
            return list(_values(parent, start, stop, skip)), None
        values = parent._getitems(range(start, stop))
        return (values if type(values) is list else list(values)), None  # (read, never changed)
    except Exception:
        pass  # Read one at a time: deliver the elements before the failing one.
    except BaseException as e:
        # sys.exit(), KeyboardInterrupt: raised at the chunk's first element (not read again).
        return [], e
    values = []
    for i in range(start, stop):
        try:
            values.append(None if i in skip else parent[i])
        except BaseException as e:
            return values, e
    return values, None


class _Chunk:
    """A read in a thread whose elements the iterator takes as they come (``_read_into``)."""

    __slots__ = ("values", "error", "done", "waiting")

    def __init__(self):
        self.values: list = []
        self.error: Optional[BaseException] = None
        self.done = False
        # Set while the iterator waits for this chunk's next element: only then
        # does its reader notify it (and no other chunk's reader does).
        self.waiting = False


def _read_into(chunk: _Chunk, parent: MapDataset, start: int, stop: int, skip: frozenset, tasks: "ReadTasks") -> None:
    """Elements ``[start, stop)`` of ``parent`` (None at ``skip``) into ``chunk``, each as it is computed.

    As ``_read``: on an error, the elements from the first one not read are
    read again one at a time, so the elements before the failing one are
    delivered, and then its error.
    """
    values = chunk.values
    append = values.append
    try:
        try:
            for value in _values(parent, start, stop, skip):
                append(value)
                if chunk.waiting:
                    tasks.wake()
            return
        except BaseException:  # (sys.exit() too: the thread would end, and the chunk with it)
            pass
        for i in range(start + len(values), stop):
            try:
                append(None if i in skip else parent[i])
            except BaseException as e:
                chunk.error = e
                return
    finally:
        tasks.finish(chunk)


class ReadTasks:
    """The read threads of one iterator and its reads in flight, in order.

    A read is ``parent._iter_items(range(start, stop))`` of a MapDataset (then
    ``parent[i]`` one at a time after an error).

    Holds no reference to the iterator, so the iterator's finalizer can own it:
    dropping the iterator cancels the reads not started and ends the threads
    once their current read returns.
    """

    def __init__(self, threads: int):
        self._threads = threads
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        # (size, future, chunk) in order; the first one's elements are taken as they come.
        self.pending: collections.deque = collections.deque()
        # close() may come from another thread while a thread prefetching this
        # iterator submits: no pool may start after it.
        self._lock = threading.Lock()
        self._closed = False
        self.taken = 0  # Elements of the first pending chunk already taken.
        # The iterator waits on this for the next element of its first chunk.
        # (Re-entrant: the finalizer of a dropped iterator may run close() in a
        # reader thread that holds it.)
        self._arrived = threading.Condition(threading.RLock())

    def submit(self, parent: MapDataset, start: int, stop: int, skip: frozenset) -> None:
        with self._lock:
            if self._closed:
                raise ClosedIteratorError(f"Trying to advance a closed iterator: reading elements {start}..{stop - 1}")
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(self._threads, thread_name_prefix="grainlike-read")
            chunk = _Chunk()
            self.pending.append((stop - start, self._pool.submit(_read_into, chunk, parent, start, stop, skip, self), chunk))

    def wake(self) -> None:
        """An element arrived (a reader thread, while the iterator waits)."""
        with self._arrived:
            self._arrived.notify_all()

    def finish(self, chunk: _Chunk) -> None:
        """A read ended (a reader thread)."""
        chunk.done = True
        if chunk.waiting:
            self.wake()

    def wait(self, chunk: _Chunk, taken: int) -> None:
        """Waits until ``chunk`` holds more than ``taken`` elements, or is done."""
        # ``waiting`` is set before the look: a reader that appended after it
        # sees it and notifies; one that appended before is seen by the look.
        with self._arrived:
            chunk.waiting = True
            try:
                while len(chunk.values) <= taken and not chunk.done and not self._closed:
                    self._arrived.wait()
            finally:
                chunk.waiting = False
        if self._closed:
            # close() from another thread; its read may never run (cancelled).
            raise ClosedIteratorError("the iterator was closed while next() waited for its elements")

    def cancel(self) -> None:
        """Drops the reads in flight (those running finish, unread)."""
        pending = self.pending
        while pending:
            pending.popleft()[1].cancel()
        self.taken = 0

    def close(self) -> None:
        """Cancels the reads and ends the threads without waiting for a read in progress."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        self.cancel()
        self.wake()  # A next() waiting in another thread.
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class PrefetchDatasetIterator(SkippingReader, NextIndexState, DatasetIterator):
    """Reads its MapDataset in chunks; see the module docstring."""

    _STATS_PREFETCH = _STATS_RECORDS_BYTES = True  # in execution statistics: a prefetch, counting bytes

    # Chunks double from one element, so that the first elements do not wait
    # behind a long read (a MapDataset may compute its elements as it reads them).
    # A subclass whose reads only read sets it False: after the first element,
    # chunks are as long as the caps allow.
    _double_chunks = True
    # Without threads, chunks hold about this many bytes at most.
    _max_chunk_bytes = _CHUNK_BYTES

    def __init__(self, parent: MapDataset, read_options: ReadOptions, allow_nones: bool, threads: int):
        super().__init__()
        self._map_parent = parent
        self._length = len(parent)
        self._read_options = read_options
        self._allow_nones = allow_nones
        self._threads = threads
        self._next_index = 0  # Index of the next element returned.
        self._ready: collections.deque = collections.deque()  # Elements from _next_index on.
        self._error: Optional[BaseException] = None  # Raised once _ready is empty.
        self._read_until = 0  # Indices below it are read or in flight.
        self._chunk = 1
        self._chunk_cap = _MAX_CHUNK
        self._in_flight = 0
        self._tasks: Optional[ReadTasks] = None
        # Warns when filters upstream leave too many Nones: windows of WINDOW
        # returned-or-dropped elements, counted by _next_index (shifted on restore).
        self._checker: Any = False  # Built at the first window's end.
        self._window_end = WINDOW
        self._dropped = 0
        self._next_check = WINDOW - 1  # The next position _checked_out looks at.
        self._chunk_bytes = self._max_chunk_bytes
        if threads:
            self._chunk_cap = max(1, min(MAX_THREAD_CHUNK, read_options.prefetch_buffer_size // threads))
            self._chunk_bytes = _THREAD_CHUNK_BYTES
            self._tasks = ReadTasks(threads)
            # Closes the threads when the iterator is collected (the reads in
            # them refer to the dataset only), or at exit.
            self._finalizer = weakref.finalize(self, self._tasks.close)

    # -- reading -------------------------------------------------------------

    def _next_chunk(self) -> tuple[int, int, frozenset]:
        """The next positions to read, ``[start, stop)``, and those of them an elastic restore skips (not read)."""
        start = self._read_until
        stop = min(self._length, start + self._chunk)
        self._read_until = stop
        self._chunk = min(self._chunk * 2, self._chunk_cap) if self._double_chunks else self._chunk_cap
        skipped = self._skipped(start, stop)
        return start, stop, frozenset(skipped) if skipped else _NOTHING

    def _element_nbytes(self, element: Any) -> int:
        """Roughly the bytes of an element, which size the chunks."""
        return tree.estimate_nbytes(element)

    def _fit_chunk(self, values: list) -> None:
        """Caps chunks at about ``_CHUNK_BYTES`` (``_THREAD_CHUNK_BYTES``) once the element size is known."""
        for v in values:
            if v is not None:
                cap = max(1, self._chunk_bytes // max(self._element_nbytes(v), 1))
                if cap < self._chunk_cap:
                    self._chunk_cap = cap
                    self._chunk = min(self._chunk, cap)
                return

    def _submit(self) -> None:
        """Keeps about ``prefetch_buffer_size`` elements in flight."""
        target = max(self._read_options.prefetch_buffer_size, 1)
        while self._in_flight < target and self._read_until < self._length:
            start, stop, skip = self._next_chunk()
            self._tasks.submit(self._map_parent, start, stop, skip)
            self._in_flight += stop - start

    def _fill(self) -> None:
        """Moves the next chunk into ``_ready`` (and its error, if any, to ``_error``)."""
        if self._threads:
            tasks = self._tasks
            pending = tasks.pending
            if not pending:
                self._submit()
            size, _, chunk = pending[0]
            # The elements of the first chunk computed so far: an element is
            # delivered without waiting for the rest of its chunk.
            taken = tasks.taken
            if len(chunk.values) <= taken and not chunk.done:
                tasks.wait(chunk, taken)
            done = chunk.done  # (read before the values: none come after it)
            values = chunk.values[taken:]
            if monitoring.recording:  # grain's prefetch_buffer_ready_count (telemetry on)
                monitoring.record_ready(pending, taken, len(values))
            tasks.taken = taken + len(values)
            error = None
            if done and tasks.taken == len(chunk.values):
                pending.popleft()  # (wait() raised if close() in another thread emptied it)
                tasks.taken = 0
                self._in_flight -= size
                error = chunk.error
                self._submit()
        else:
            values, error = _read(self._map_parent, *self._next_chunk())
        self._fit_chunk(values)
        self._ready.extend(values)
        self._error = error

    def __next__(self):
        if self._closed:  # Tested here, not by a call: this runs once per element.
            self._assert_not_closed()
        while True:
            if not self._ready:
                if self._error is not None:
                    error = self._error
                    # A later next() retries the failing element.
                    self._restart_at(self._next_index)
                    raise error
                if self._next_index >= self._length:
                    raise StopIteration
                self._fill()
                continue
            value = self._ready.popleft()
            self._next_index += 1
            if self._next_index > self._next_check and self._checked_out(value):
                continue
            if value is not None or self._allow_nones:
                return value
            self._dropped += 1

    def take(self, k: int) -> Chunk:
        """What ``k`` calls of ``next()`` would return, or fewer (at least one), in one call (``chunk.py``).

        The elements sit at consecutive positions: a take stops before a
        position to check (one an elastic restore skips; without
        ``allow_nones``, a window's end), before a None that is dropped, which
        one ``next()`` passes, and before a read's error. Raises as ``next()``
        does (``StopIteration`` at the end).
        """
        start = self._next_index
        values = self._run(k)
        if values is None:  # At a position next() passes, or at an error or the end, next() raises.
            value = PrefetchDatasetIterator.__next__(self)
            return Chunk([value], self._next_index - 1, self)
        while len(values) < k:  # On into the next read chunks.
            more = self._run(k - len(values))
            if more is None:
                break
            values += more
        return Chunk(values, start, self)

    def _run(self, k: int) -> Optional[list]:
        """Up to ``k`` elements from ``_next_index`` on, read if none are; None where ``take`` stops."""
        ready = self._ready
        if not ready:
            if self._error is not None or self._next_index >= self._length or self._closed:
                return None
            if not self._threads and self._allow_nones:
                # A whole read chunk, handed over without the buffer where it can be.
                values, self._error = _read(self._map_parent, *self._next_chunk())
                self._fit_chunk(values)
                if 0 < len(values) == min(len(values), k, self._next_skip - self._next_index):
                    return self._advanced(values)
                ready.extend(values)
            else:
                self._fill()
        # With allow_nones nothing is dropped, so a window's end needs no look.
        n = min(k, len(ready), (self._next_skip if self._allow_nones else self._next_check) - self._next_index)
        if n <= 0 or self._closed or (not self._allow_nones and ready[0] is None):
            return None
        values = list(ready)
        ready.clear()
        if n < len(values):
            ready.extend(values[n:])
            del values[n:]
        if not self._allow_nones:
            # (Identity: ``==`` would compare arrays element-wise.)
            end = next((i for i, v in enumerate(values) if v is None), n)
            if end < n:
                ready.extendleft(reversed(values[end:]))
                del values[end:]
        return self._advanced(values)

    def _advanced(self, values: list) -> list:
        self._next_index += len(values)
        if self._next_index >= self._window_end:
            self._end_window()
            self._next_check = min(self._next_skip, self._window_end - 1)
        return values

    def rewind(self, index: int) -> None:
        """Drops what was read ahead: the next element delivered is the one at position ``index``.

        A stage above, which took elements in chunks (``take``), moves the
        reading back to where ``next()`` would have left it after an error.
        """
        self._restart_at(index)
        self._next_skip = 0  # (Looked up again.)

    def _checked_out(self, value: Any) -> bool:
        """At a position to skip or a window's end: whether not to deliver ``value``.

        A position delivered before an elastic restore is skipped; every
        ``WINDOW`` elements, the share of Nones dropped is checked (grain's check).
        """
        position = self._next_index - 1
        drop = position >= self._next_skip and self._skips(position)
        if not drop and value is None and not self._allow_nones:
            drop = True
            self._dropped += 1
        if self._next_index >= self._window_end:
            self._end_window()
        self._next_check = min(self._next_skip, self._window_end - 1)
        return drop

    def _end_window(self) -> None:
        dropped, self._dropped = self._dropped, 0
        self._window_end = self._next_index + WINDOW
        if self._checker is False:
            self._checker = FilterThresholdChecker.for_iterator(self)
        if self._checker is not None:
            self._checker.end_window(WINDOW, dropped)

    def _restart_at(self, index: int) -> None:
        """Drops everything read ahead; the next read starts at ``index``."""
        if self._tasks is not None:
            self._tasks.cancel()
        self._in_flight = 0
        self._ready.clear()
        self._error = None
        self._window_end += index - self._next_index  # Windows count elements consumed.
        self._next_check = 0
        self._next_index = self._read_until = index
        self._chunk = 1

    def start_prefetch(self) -> None:
        if self._threads and not self._closed and not self._tasks.pending and not self._ready:
            self._submit()

    def _close(self) -> None:
        """Stops the read threads without waiting for a read in progress."""
        self._ready.clear()
        if self._tasks is not None:
            self._finalizer()

    def __str__(self) -> str:
        return f"PrefetchDatasetIterator(read_options={self._read_options}, allow_nones={self._allow_nones})"


class _ThreadedPrefetchDatasetIterator(PrefetchDatasetIterator):
    """A ``PrefetchDatasetIterator`` with read threads, which threads may share.

    ``next()``, ``set_state()`` and ``start_prefetch()`` take turns (the state is
    one int, read without the lock). Without read threads (a local source that
    does not wait) the lock is left out: at ~0.2 us it would halve the rate of
    the cheapest elements (see docs/troubleshooting.md).
    """

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._consumer_lock = threading.Lock()

    def __next__(self):
        with self._consumer_lock:
            return super().__next__()

    def take(self, k: int) -> Chunk:
        with self._consumer_lock:
            return super().take(k)

    def rewind(self, index: int) -> None:
        with self._consumer_lock:
            super().rewind(index)

    def set_state(self, state: dict) -> None:
        with self._consumer_lock:
            super().set_state(state)

    def start_prefetch(self) -> None:
        with self._consumer_lock:
            super().start_prefetch()
