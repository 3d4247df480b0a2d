"""Shared-memory arrays for batches: written once by a worker, mapped by the consumer.

A worker stacks each large batch leaf straight into a segment of anonymous
shared memory (``core.memfd``) from its ``SegmentPool``. A segment's descriptor
travels to the consumer once (``SCM_RIGHTS``), right after the first message
that uses it; each process maps it and closes the descriptor. The memory has no
name and ends with its last mapping, so nothing is ever left behind, and the
mappings hold no descriptors, so holding any number of batches costs none.

The consumer (``SegmentReader``) maps each segment once. The arrays of one
message reference a lease on that mapping; when the last of them goes, the
segment is returned to the worker for reuse.

The hand-off keeps each array's type and layout: a ``SharedMemoryArray``
arrives as a ``SharedMemoryArray`` (a view on the consumer's mapping), a plain
array as a plain one, a Fortran-ordered one in Fortran order. Which leaves are
``SharedMemoryArray``s is the task's choice (``mp_prefetch`` makes grain's:
``core.shared_memory_array.as_delivered``); batches stacked with
``SegmentPool.alloc`` are, as grain's workers stack into shared memory.
"""

from __future__ import annotations

import collections
import math
import mmap
import os
import socket
from typing import Any, Callable, Sequence

import numpy as np

from grainlike.core import memfd, tree
from grainlike.core.memfd import Region, new_segment
from grainlike.core.shared_memory_array import SharedMemoryArray

# Leaves smaller than this travel inline through the pipe: below it a segment's
# map costs more than pickling the bytes.
INLINE_LIMIT = 64 * 1024


def available() -> bool:
    """Whether batches can travel in anonymous shared memory on this platform."""
    return memfd.available() and hasattr(socket, "send_fds")


def raise_fd_limit() -> None:
    """Raises this process's soft limit of open files to its hard limit (at most 65536).

    Batches hold no descriptors; sources, sockets and the user's own files may.
    """
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = 1 << 16 if hard == resource.RLIM_INFINITY else min(hard, 1 << 16)
        if soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):
        pass


class _Lease:
    """The arrays of one message on a segment: their ``.base``, reporting when they are all gone."""

    __slots__ = ("_region", "__array_interface__", "_seg_id", "_on_release", "__weakref__")

    def __init__(self, region: Region, seg_id: int, on_release: Callable[[int], None]):
        self._region = region
        self.__array_interface__ = region.__array_interface__
        self._seg_id = seg_id
        self._on_release = on_release

    def __del__(self) -> None:
        # From whichever thread drops the last array; cheaper per leaf than a
        # weakref.finalize. on_release only records the id.
        self._on_release(self._seg_id)


def send_fds(conn: Any, fds: Sequence[int]) -> None:
    """Sends descriptors over a ``multiprocessing`` connection that is a Unix socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=conn.fileno())
    try:
        socket.send_fds(sock, [b"F"], list(fds))
    finally:
        sock.detach()  # The connection keeps owning the descriptor.


def recv_fds(conn: Any, count: int) -> list:
    """Receives ``count`` descriptors sent by ``send_fds``; raises EOFError if the peer is gone."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=conn.fileno())
    try:
        data, fds, flags, _ = socket.recv_fds(sock, 1, count)
    finally:
        sock.detach()
    if len(fds) != count or not data:
        for fd in fds:
            os.close(fd)
        if not data:
            raise EOFError("the worker's socket closed before its segments arrived")
        raise RuntimeError(f"expected {count} shared-memory descriptors from a worker, got {len(fds)}")
    return fds


# Leaf types that hold no ShmLeaf (materialize returns them as they are).
_PLAIN_LEAVES = frozenset((np.ndarray, SharedMemoryArray, int, float, str, bytes, bool, type(None)))
# Scalars (np.int32(...)) too.
_PLAIN_LEAVES |= frozenset(np.sctypeDict.values())

# ShmLeaf.layout: how the consumer views the segment's bytes.
_PLAIN, _FORTRAN, _SHARED = 0, 1, 2


class ShmLeaf:
    """A message's stand-in for an array in a segment.

    ``layout`` is ``_PLAIN`` (a C-ordered ndarray), ``_FORTRAN`` (an ndarray
    in Fortran order) or ``_SHARED`` (a C-ordered ``SharedMemoryArray``).
    """

    __slots__ = ("seg_id", "shape", "dtype", "layout")

    def __init__(self, seg_id: int, shape: tuple, dtype: Any, layout: int = _PLAIN):
        self.seg_id, self.shape, self.dtype, self.layout = seg_id, shape, dtype, layout

    def __reduce__(self):
        return (ShmLeaf, (self.seg_id, self.shape, self.dtype, self.layout))


class _Segment:
    __slots__ = ("seg_id", "size", "region")

    def __init__(self, seg_id: int, size: int, region: Region):
        self.seg_id, self.size, self.region = seg_id, size, region


def _on(base: Any, shape: tuple, dtype: Any) -> np.ndarray:
    """An array of ``shape`` and ``dtype`` at the start of ``base``'s memory."""
    dtype = np.dtype(dtype)
    # math.prod: np.prod costs the consumer several microseconds per leaf.
    nbytes = math.prod(shape) * dtype.itemsize
    return np.asarray(base)[:nbytes].view(dtype).reshape(shape)


class SegmentPool:
    """A worker's segments: allocated for batch leaves, reused once released.

    New segments' descriptors wait in ``take_unsent()`` until they are sent to
    the consumer (and closed).
    """

    def __init__(self):
        self._next_id = 0
        self._free: dict[int, list[_Segment]] = collections.defaultdict(list)
        self._lent: dict[int, _Segment] = {}
        # Arrays allocated for the output being built: id(array) -> segment.
        self._pending: dict[int, tuple[np.ndarray, _Segment]] = {}
        self._unsent: list[tuple[int, int, int]] = []  # (seg_id, size, fd)

    def _take(self, nbytes: int) -> _Segment:
        # Sizes rounded up to pages, so that slightly different batches share segments.
        size = -(-max(nbytes, 1) // mmap.PAGESIZE) * mmap.PAGESIZE
        free = self._free.get(size)
        if free:
            return free.pop()
        seg_id = self._next_id
        self._next_id += 1
        fd, region = new_segment(size)
        self._unsent.append((seg_id, size, fd))
        return _Segment(seg_id, size, region)

    def alloc(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """An array for a stacked leaf: in a segment if large, else ordinary memory.

        A ``SharedMemoryArray`` unless it holds Python objects or nothing (as
        grain's workers stack batches into shared memory); it arrives as one.
        """
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if dtype.hasobject or nbytes == 0:
            return np.empty(shape, dtype)
        if nbytes < INLINE_LIMIT:
            return np.empty(shape, dtype).view(SharedMemoryArray)
        seg = self._take(nbytes)
        arr = _on(seg.region, shape, dtype).view(SharedMemoryArray)
        self._pending[id(arr)] = (arr, seg)
        return arr

    def export(self, batch: Any) -> Any:
        """Replaces large array leaves with ``ShmLeaf``s (copying those not yet in a segment)."""

        def leaf(x: Any) -> Any:
            if not isinstance(x, np.ndarray):
                return x
            layout = _SHARED if isinstance(x, SharedMemoryArray) else _PLAIN
            hit = self._pending.pop(id(x), None)
            if hit is not None and hit[0] is x:
                seg = hit[1]
            elif x.nbytes >= INLINE_LIMIT and not x.dtype.hasobject:
                seg = self._take(x.nbytes)
                if layout == _PLAIN and x.flags.f_contiguous and not x.flags.c_contiguous:
                    # As a pickle keeps it: the transpose's C order is x's Fortran order.
                    layout = _FORTRAN
                    np.copyto(_on(seg.region, x.shape[::-1], x.dtype), x.T)
                else:
                    np.copyto(_on(seg.region, x.shape, x.dtype), x)
            else:
                return x
            self._lent[seg.seg_id] = seg
            # A structured dtype's str (|V12) loses its fields.
            dtype = x.dtype.str if x.dtype.names is None else x.dtype
            return ShmLeaf(seg.seg_id, x.shape, dtype, layout)

        out = tree.map_structure(leaf, batch)
        # Leaves allocated but not part of the output (a batch_fn dropped them).
        for _, seg in self._pending.values():
            self._free[seg.size].append(seg)
        self._pending.clear()
        return out

    def lent_count(self) -> int:
        """How many segments the consumer holds or has yet to receive (exports add one per leaf)."""
        return len(self._lent)

    def take_unsent(self) -> list[tuple[int, int, int]]:
        """``(seg_id, size, fd)`` of segments the consumer has not received yet; the caller closes the fds."""
        unsent, self._unsent = self._unsent, []
        return unsent

    def keep_unsent(self, unsent: list[tuple[int, int, int]]) -> None:
        """Puts back what ``take_unsent`` returned, when it could not be sent."""
        self._unsent[:0] = unsent

    def release(self, seg_ids) -> None:
        """The consumer no longer maps these segments: they can be reused."""
        for seg_id in seg_ids:
            seg = self._lent.pop(seg_id, None)
            if seg is not None:
                self._free[seg.size].append(seg)


class SegmentReader:
    """The consumer's side: turns ``ShmLeaf``s into arrays on its mappings of the segments.

    Args:
      on_release: called with a segment id from whichever thread drops the last
        array of a message on that segment; it must only record the id (e.g.
        append to a deque).
    """

    def __init__(self, on_release: Callable[[int], None]):
        self._regions: dict[int, Region] = {}
        self._on_release = on_release

    def add(self, segments: Sequence[tuple[int, int]], fds: Sequence[int]) -> None:
        """Maps new segments ``(seg_id, size)`` from their descriptors, which it closes."""
        try:
            for (seg_id, size), fd in zip(segments, fds):
                self._regions[seg_id] = Region(fd, size, populate=True)
        finally:
            for fd in fds:
                os.close(fd)

    def array(self, leaf: ShmLeaf) -> np.ndarray:
        """The array ``leaf`` stands for, of its type and layout, on the mapping (nothing copied)."""
        lease = _Lease(self._regions[leaf.seg_id], leaf.seg_id, self._on_release)
        layout = leaf.layout
        if layout == _SHARED:
            return _on(lease, leaf.shape, leaf.dtype).view(SharedMemoryArray)
        if layout == _FORTRAN:
            return _on(lease, tuple(leaf.shape)[::-1], leaf.dtype).T
        return _on(lease, leaf.shape, leaf.dtype)

    def materialize(self, batch: Any) -> Any:
        """``batch`` with every ``ShmLeaf`` replaced by its array."""
        # The common batches (a leaf, a plain dict of leaves) without the general
        # tree walk, which costs the consumer more than the arrays themselves.
        t = type(batch)
        if t is ShmLeaf:
            return self.array(batch)
        if t is dict:
            return {k: self.materialize(v) for k, v in batch.items()}
        if t in _PLAIN_LEAVES:
            return batch
        return tree.map_structure(lambda x: self.array(x) if type(x) is ShmLeaf else x, batch)

    def close(self) -> None:
        """Drops the mappings; arrays already handed out keep theirs."""
        self._regions = {}
