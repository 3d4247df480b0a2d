"""Shared-memory arrays for batches: written once by a worker, mapped by the consumer.

A worker stacks each large batch leaf straight into a segment of anonymous
shared memory (``core.memfd``) from its ``SegmentPool``. A segment's descriptor
travels to the consumer once (``SCM_RIGHTS``, on the worker's control socket),
right after the first message that uses it; each process maps it and closes
the descriptor. The memory has no name and ends with its last mapping, so
nothing is ever left behind, and the mappings hold no descriptors, so holding
any number of batches costs none.

The consumer (``SegmentReader``) maps each segment once. The arrays of a leaf
reference a lease on that mapping (``_lease_type``); when the last of them
goes, the segment is returned to the worker for reuse. In a message a leaf in
a segment is a ``ShmLeaf`` (in a frame's table, its segment id: ``frames``).

The hand-off keeps each array's type and layout: a ``SharedMemoryArray``
arrives as a ``SharedMemoryArray`` (a view on the consumer's mapping), a plain
array as a plain one, a Fortran-ordered one in Fortran order. Which leaves are
``SharedMemoryArray``s is the task's choice (``mp_prefetch`` makes grain's:
``core.shared_memory_array.as_delivered``); batches stacked with
``SegmentPool.alloc`` are, as grain's workers stack into shared memory.
"""

from __future__ import annotations

import collections
import ctypes
import math
import mmap
import os
import socket
from typing import Any, Callable, Optional, Sequence

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


def _release_lease(lease: Any) -> None:
    """A lease's ``__del__``: its segment's last array on it is gone (see ``_lease_type``)."""
    try:
        seg_id, on_release, _ = lease.info
    except AttributeError:  # Never given its info.
        return
    on_release(seg_id)


# One lease type per segment size (a ctypes array type has its length).
_LEASE_TYPES: dict = {}


def _lease_type(size: int) -> type:
    """The type of a lease: a segment's bytes as a ``ctypes`` array, the ``.base`` of one leaf's arrays.

    When the last of those arrays goes, the lease returns the segment
    (``on_release`` only records the id, from whichever thread drops it):
    cheaper per leaf than a ``weakref.finalize``, and made with one C call
    (``from_address``). ``info`` is ``(seg_id, on_release, region)``; the region
    keeps the mapping.
    """
    t = _LEASE_TYPES.get(size)
    if t is None:
        if len(_LEASE_TYPES) >= 4096:  # Types in use stay alive with their leases.
            _LEASE_TYPES.clear()
        t = _LEASE_TYPES[size] = type(
            "_Lease", (ctypes.c_ubyte * size,), {"__slots__": ("info",), "__del__": _release_lease}
        )
    return t


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
        # Returns the ids of segments the consumer let go since, when none is free.
        self.refill: Optional[Callable[[], list]] = None
        self._lends = 0

    def _take(self, nbytes: int) -> _Segment:
        # Sizes rounded up to pages, so that slightly different batches share segments.
        size = -(-max(nbytes, 1) // mmap.PAGESIZE) * mmap.PAGESIZE
        free = self._free.get(size)
        if not free and self.refill is not None:
            self.release(self.refill())
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
            self._lends += 1
            # A structured dtype's str (|V12) loses its fields.
            dtype = x.dtype.str if x.dtype.names is None else x.dtype
            return ShmLeaf(seg.seg_id, x.shape, dtype, layout)

        out = tree.map_structure(leaf, batch)
        # Leaves allocated but not part of the output (a batch_fn dropped them).
        for _, seg in self._pending.values():
            self._free[seg.size].append(seg)
        self._pending.clear()
        return out

    def lends(self) -> int:
        """How many times a segment was lent so far (an export that lends one puts a leaf in shared memory)."""
        return self._lends

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
    """The consumer's side: arrays on its mappings of the segments.

    ``leases[seg_id]`` is ``(lease type, address, info)``: an array on the
    segment is made on ``lease type.from_address(address)`` given ``info``
    (see ``_Lease``).

    Args:
      on_release: called with a segment id from whichever thread drops the last
        array of a leaf on that segment; it must only record the id (e.g.
        append to a deque).
    """

    def __init__(self, on_release: Callable[[int], None]):
        self.leases: dict[int, tuple] = {}
        self._on_release = on_release

    def add(self, segments: Sequence[tuple[int, int]], fds: Sequence[int]) -> None:
        """Maps new segments ``(seg_id, size)`` from their descriptors, which it closes."""
        try:
            for (seg_id, size), fd in zip(segments, fds):
                region = Region(fd, size, populate=True)
                address = region.__array_interface__["data"][0]
                self.leases[seg_id] = (_lease_type(size), address, (seg_id, self._on_release, region))
        finally:
            for fd in fds:
                os.close(fd)

    def array(self, leaf: ShmLeaf) -> np.ndarray:
        """The array ``leaf`` stands for, of its type and layout, on the mapping (nothing copied)."""
        lease_type, address, info = self.leases[leaf.seg_id]
        lease = lease_type.from_address(address)
        lease.info = info
        t = SharedMemoryArray if leaf.layout == _SHARED else np.ndarray
        return np.ndarray.__new__(t, leaf.shape, leaf.dtype, lease, 0, None, "F" if leaf.layout == _FORTRAN else "C")

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
        self.leases = {}
