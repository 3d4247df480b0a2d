"""grain's ``SharedMemoryArray``: a numpy array in a named shared-memory segment.

Another process maps the same memory from the small ``SharedMemoryArrayMetadata``
(name, shape, dtype). grain's public API for moving arrays between processes by
hand; grainlike's own workers use memory without names (``core.memfd``). The last
user must call ``unlink_on_del()`` on one array, or the segment outlives the
processes, as in grain.

It is also the type of the arrays ``mp_prefetch`` (and so a DataLoader with
workers) delivers, as in grain: ``as_delivered`` types, in a worker, the leaves
grain's workers would copy into shared memory; the hand-off keeps the types, and
the consumer gets ``SharedMemoryArray`` views on the anonymous memory the worker
wrote (nothing copied). Those have no named segment (``shm`` is None): they
pickle by value, ``metadata`` says it has no name to give, and
``unlink_on_del()`` has nothing to do (the memory goes with its last array).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import mmap
import threading
from multiprocessing import pool as mp_pool
from multiprocessing import shared_memory
from typing import Any, Iterable, Optional

import numpy as np
import numpy.typing as npt

from grainlike.core import shm_owner, tree

__all__ = [
    "SharedMemoryArray",
    "SharedMemoryArrayMetadata",
    "as_delivered",
    "copy_to_shm",
    "open_from_shm",
    "unlink_shm",
]


@dataclasses.dataclass(slots=True, frozen=True)
class SharedMemoryArrayMetadata:
    """What another process needs to map a ``SharedMemoryArray``: name, shape, dtype."""

    name: str
    shape: Iterable[int]
    dtype: npt.DTypeLike

    def close_and_unlink_shm(self) -> None:
        """Frees the segment this metadata names (for an array nobody will open)."""
        segment = shared_memory.SharedMemory(self.name)
        segment.close()
        segment.unlink()


def _release(segment: shared_memory.SharedMemory, unlink: bool) -> None:
    segment.close()
    if unlink:
        segment.unlink()


class SharedMemoryArray(np.ndarray):
    """A numpy array backed by a named shared-memory segment.

    ``SharedMemoryArray(shape, dtype)`` creates a segment of exactly the array's
    size. Pickling it sends only the segment's name, shape and dtype; the receiver
    maps the same memory. Results of arithmetic on it are plain ndarrays.

    Example:
      >>> a = SharedMemoryArray((2, 3), dtype=np.int32)
      >>> a[:] = 7
      >>> b = SharedMemoryArray.from_metadata(a.metadata)
      >>> int(b.sum())
      42
      >>> b.unlink_on_del()
      >>> del a, b
    """

    shm: Optional[shared_memory.SharedMemory]

    _lock = threading.Lock()
    _del_thread_pool: Optional[mp_pool.ThreadPool] = None
    _outstanding_del_requests: Optional[threading.Semaphore] = None

    def __new__(cls, shape: Iterable[int], dtype: npt.DTypeLike = float) -> "SharedMemoryArray":
        shape = tuple(shape)
        size = math.prod(shape) * np.dtype(dtype).itemsize
        return cls.from_shared_memory(shared_memory.SharedMemory(create=True, size=size), shape, dtype)

    @classmethod
    def from_shared_memory(
        cls, shm: shared_memory.SharedMemory, shape: Any, dtype: npt.DTypeLike
    ) -> "SharedMemoryArray":
        """The array of ``shape`` and ``dtype`` over the open segment ``shm``."""
        array = super().__new__(cls, shape, dtype, buffer=shm.buf)
        array.shm = shm
        array._unlink_on_del = False
        return array

    @classmethod
    def from_metadata(cls, metadata: SharedMemoryArrayMetadata) -> "SharedMemoryArray":
        """Maps the segment ``metadata`` names (made by this or another process of this user's).

        Raises:
          UnsafeSegmentError: the segment is another user's or writable by others.
        """
        segment = shared_memory.SharedMemory(metadata.name)
        try:
            shm_owner.check_own(segment._fd, metadata.name, "SharedMemoryArray's segment")
        except BaseException:
            segment.close()
            # Opening registered it: the tracker would remove another user's segment at exit.
            shared_memory.resource_tracker.unregister(segment._name, "shared_memory")
            raise
        return cls.from_shared_memory(segment, metadata.shape, metadata.dtype)

    @property
    def metadata(self) -> SharedMemoryArrayMetadata:
        """Name, shape and dtype: what another process needs to map this array."""
        if not isinstance(self.shm, shared_memory.SharedMemory):
            raise ValueError(
                "this SharedMemoryArray has no named shared-memory segment: it is a copy, "
                "or an array a worker handed over in anonymous shared memory, which has no "
                "name to give. Pickle it (it pickles by value), or copy it into a new "
                "segment: `b = SharedMemoryArray(a.shape, a.dtype); b[...] = a`, and send "
                "`b.metadata`"
            )
        return SharedMemoryArrayMetadata(name=self.shm.name, shape=self.shape, dtype=self.dtype)

    def __array_finalize__(self, obj: Any) -> None:
        # As numpy.memmap: a view of the segment keeps it; anything else has none.
        segment = getattr(obj, "shm", None)
        self.shm = segment if segment is not None and np.may_share_memory(self, obj) else None
        self._unlink_on_del = getattr(obj, "_unlink_on_del", False)

    def __array_wrap__(self, obj: Any, context: Any = None, return_scalar: bool = False) -> Any:
        # Computed results are new memory: plain ndarrays (and scalars), as numpy.memmap.
        if self is obj:
            return obj
        if return_scalar:
            return obj[()]
        return obj.view(np.ndarray)

    def __reduce_ex__(self, protocol: int) -> Any:
        # An array over a whole named segment pickles as the segment's name: the
        # data never goes through the pickle. Any other (a view, a copy, an array a
        # worker handed over in anonymous memory) pickles its data, and is still a
        # SharedMemoryArray when loaded: a name would map the wrong bytes, or none.
        if self.shm is None or not isinstance(self.base, mmap.mmap):
            # As a plain array, which pickles its buffer out of band where the pickler can.
            return _viewed_as_shared_memory_array, (self.view(np.ndarray),)
        return self.from_shared_memory, (self.shm, self.shape, self.dtype)

    def unlink_on_del(self) -> None:
        """Makes this array free the segment when it is deleted (the last user must)."""
        self._unlink_on_del = True

    @classmethod
    def enable_async_del(cls, num_threads: int = 1, max_outstanding_requests: int = 50) -> None:
        """Closes (and unlinks) segments of deleted arrays in background threads.

        Args:
          num_threads: threads doing the closing.
          max_outstanding_requests: at most this many deletions wait for a thread;
            beyond that a deletion is done at once, so open segments stay bounded.
        """
        with cls._lock:
            if SharedMemoryArray._del_thread_pool is None:
                SharedMemoryArray._outstanding_del_requests = threading.Semaphore(
                    max(max_outstanding_requests, num_threads)
                )
                SharedMemoryArray._del_thread_pool = mp_pool.ThreadPool(num_threads)

    @classmethod
    def close_shm_async(cls, shm: shared_memory.SharedMemory, unlink: bool) -> None:
        """Closes (and unlinks) ``shm`` in a background thread; frees its request slot."""
        try:
            _release(shm, unlink)
        finally:
            if SharedMemoryArray._outstanding_del_requests is not None:
                SharedMemoryArray._outstanding_del_requests.release()

    def __del__(self) -> None:
        # Only the array that maps the segment itself releases it, never a view; and
        # never raise (this may run at interpreter exit, with modules torn down).
        try:
            if not isinstance(self.base, mmap.mmap):
                return
            segment = self.shm
            if segment is None:
                return
            unlink = self._unlink_on_del
            workers = SharedMemoryArray._del_thread_pool
            slots = SharedMemoryArray._outstanding_del_requests
            if workers is not None and slots is not None and slots.acquire(blocking=False):
                workers.apply_async(SharedMemoryArray.close_shm_async, (segment, unlink))
            else:
                _release(segment, unlink)
        except Exception:  # pylint: disable=broad-except
            pass


def _viewed_as_shared_memory_array(array: np.ndarray) -> SharedMemoryArray:
    return array.view(SharedMemoryArray)


# -- whole structures ------------------------------------------------------------------


def _is_metadata(x: Any) -> bool:
    # A dataclass, which the tree walker would otherwise walk into.
    return isinstance(x, SharedMemoryArrayMetadata)


def _goes_to_shm(leaf: Any, min_size: int) -> bool:
    """Whether grain's workers hand ``leaf`` over in shared memory (its ``copy_to_shm``'s test)."""
    return (
        isinstance(leaf, np.ndarray)
        and not leaf.dtype.hasobject  # object arrays hold pointers into this process
        and leaf.flags.c_contiguous
        and leaf.size != 0  # a segment cannot be empty
        and leaf.nbytes >= min_size
    )


def _copy_leaf_to_shm(leaf: Any, min_size: int) -> Any:
    if isinstance(leaf, SharedMemoryArray) and leaf.shm is not None:
        return leaf.metadata
    if not _goes_to_shm(leaf, min_size):
        return leaf
    out = SharedMemoryArray(leaf.shape, leaf.dtype)
    np.copyto(out, leaf, casting="no")
    return out.metadata


def copy_to_shm(struct: Any, min_size: int = 0) -> Any:
    """Copies the arrays of a structure into new shared-memory segments, as grain's ``copy_to_shm``.

    Each C-contiguous numpy array of at least ``min_size`` bytes (not empty,
    without Python objects) becomes the ``SharedMemoryArrayMetadata`` of a new
    segment holding a copy of it; a ``SharedMemoryArray`` becomes its metadata
    without a copy; every other leaf stays as it is. The segments live until
    ``open_from_shm``'s arrays are deleted or ``unlink_shm`` frees them.

    Args:
      struct: a tree (see ``grainlike.core.tree``) of arrays and other leaves.
      min_size: arrays smaller than this many bytes are left in place.

    Returns:
      ``struct`` with the copied arrays replaced by their metadata.

    Example:
      >>> sent = copy_to_shm({"x": np.arange(4), "n": 1})
      >>> received = open_from_shm(sent)
      >>> received["x"].tolist(), received["n"]
      ([0, 1, 2, 3], 1)
    """
    return tree.map_structure(lambda leaf: _copy_leaf_to_shm(leaf, min_size), struct, is_leaf=_is_metadata)


def _open_leaf(leaf: Any) -> Any:
    if isinstance(leaf, SharedMemoryArrayMetadata):
        array = SharedMemoryArray.from_metadata(leaf)
        array.unlink_on_del()
        return array
    return leaf


def open_from_shm(struct: Any) -> Any:
    """Maps the segments ``copy_to_shm`` made; the arrays free them when deleted.

    Each ``SharedMemoryArrayMetadata`` leaf becomes a ``SharedMemoryArray`` over
    its segment, marked ``unlink_on_del()``; other leaves stay as they are.
    """
    return tree.map_structure(_open_leaf, struct, is_leaf=_is_metadata)


def _unlink_leaf(leaf: Any) -> None:
    if isinstance(leaf, SharedMemoryArrayMetadata):
        leaf.close_and_unlink_shm()


def unlink_shm(struct: Any) -> None:
    """Frees the segments named by a structure's ``SharedMemoryArrayMetadata`` leaves.

    For a structure from ``copy_to_shm`` that will never be opened.
    """
    tree.map_structure(_unlink_leaf, struct, is_leaf=_is_metadata)


# The containers JAX's tree functions walk (grain maps its workers' outputs with
# them): an unregistered dataclass or dict subclass is one leaf, arrays and all.
_JAX_NODES = frozenset({dict, list, tuple, type(None), collections.OrderedDict, collections.defaultdict})
_SCALARS = frozenset({int, float, bool, str, bytes, type(None)})


def _jax_leaf(x: Any) -> bool:
    t = type(x)
    return t not in _JAX_NODES and not (isinstance(x, tuple) and hasattr(t, "_fields"))


def _delivered_leaf(leaf: Any, min_size: int) -> Any:
    if isinstance(leaf, SharedMemoryArray):
        if leaf.shm is not None or _goes_to_shm(leaf, min_size):
            return leaf  # grain sends a segment's name whatever its size
        # Stacked by a worker's allocator where grain's worker would stack a plain array.
        return leaf.view(np.ndarray)
    if _goes_to_shm(leaf, min_size):
        return leaf.view(SharedMemoryArray)
    return leaf


def as_delivered(struct: Any, min_size: int = 0) -> Any:
    """``struct`` with the leaves grain's workers hand over in shared memory typed ``SharedMemoryArray``.

    What the consumer of grain's ``mp_prefetch`` gets from a worker: each
    C-contiguous, non-empty numpy array of at least ``min_size`` bytes without
    Python objects is a ``SharedMemoryArray`` (here a view: nothing is copied
    and no segment is made), every other array a plain one, except that a
    ``SharedMemoryArray`` on a named segment stays one whatever its size; other
    leaves, and everything inside a dataclass or another object JAX's tree
    functions take as a leaf, stay as they are. A worker calls it on each
    output before handing it over; the hand-off keeps the types.

    Args:
      struct: a worker's output.
      min_size: the pipeline's ``DatasetOptions.min_shm_size``.

    Example:
      >>> out = as_delivered({"x": np.arange(3), "s": "a", "t": np.arange(6)[::2]})
      >>> [type(v).__name__ for v in out.values()]
      ['SharedMemoryArray', 'str', 'ndarray']
    """
    if type(struct) in _SCALARS:
        return struct
    return tree.map_structure(lambda leaf: _delivered_leaf(leaf, min_size), struct, is_leaf=_jax_leaf)
