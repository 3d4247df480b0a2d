"""Shared-memory arrays for batches: written once by a worker, mapped by the consumer.

A worker stacks each large batch leaf straight into a POSIX shared-memory segment
from its ``SegmentPool``; the message to the consumer names the segment. The
consumer (``SegmentReader``) opens the segment once, unlinks its name at once (so
nothing is left in ``/dev/shm`` even if every process is killed later), and maps it
afresh for every batch. The arrays it hands out keep that mapping alive for as long
as they, or any view of them, are referenced; when the last one goes, the segment
is returned to the worker for reuse. Segments are never registered with
multiprocessing's resource tracker: their lifetime is managed here, so there are
no tracker warnings at exit.
"""

from __future__ import annotations

import collections
import mmap
import os
import weakref
from typing import Any, Callable

import numpy as np

from grainlike.core import shm_owner, tree

try:
    import _posixshmem
except ImportError:  # pragma: no cover - non-POSIX platforms
    _posixshmem = None

# Leaves smaller than this travel inline through the pipe: below it a segment's
# open/map costs more than pickling the bytes.
INLINE_LIMIT = 64 * 1024
_ALIGN = 64
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
SHM_DIR = "/dev/shm"


def available() -> bool:
    return _posixshmem is not None


def _open(name: str, create: bool) -> int:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    return _posixshmem.shm_open("/" + name, flags, 0o600)


def unlink(name: str) -> None:
    """Removes a segment's name; mappings that exist stay valid."""
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass


def _names(prefix: str) -> list:
    """Names of the segments in ``/dev/shm`` that start with ``prefix``."""
    try:
        return [n for n in os.listdir(SHM_DIR) if n.startswith(prefix)]
    except OSError:
        return []


def unlink_prefix(prefix: str) -> int:
    """Unlinks every segment whose name starts with ``prefix``; returns how many."""
    names = _names(prefix)
    for name in names:
        unlink(name)
    return len(names)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_orphans() -> int:
    """Unlinks ``InMemoryDataSource`` segments whose owner is provably dead.

    Their owner unlinks them on close or exit, but if a whole process group is
    killed at once nobody is left to do it; the next loader does, for segments
    of its own PID namespace and user only (see ``core.shm_owner``). Returns
    how many went.
    """
    return shm_owner.sweep_orphans("grainlike_src_")


def raise_fd_limit() -> None:
    """Raises this process's soft limit of open files to its hard limit (at most 65536).

    Each batch leaf mapped from a segment may hold a descriptor, and workers
    hold one per segment they made.
    """
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else 1 << 16
        target = min(target, 1 << 16)
        if soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):
        pass


class ShmLeaf:
    """A message's stand-in for an array in a segment."""

    __slots__ = ("seg_id", "name", "size", "shape", "dtype")

    def __init__(self, seg_id: int, name: str, size: int, shape: tuple, dtype: str):
        self.seg_id, self.name, self.size, self.shape, self.dtype = seg_id, name, size, shape, dtype

    def __reduce__(self):
        return (ShmLeaf, (self.seg_id, self.name, self.size, self.shape, self.dtype))


class _Segment:
    __slots__ = ("seg_id", "name", "size", "mm")

    def __init__(self, seg_id: int, name: str, size: int, mm: mmap.mmap):
        self.seg_id, self.name, self.size, self.mm = seg_id, name, size, mm


class SegmentPool:
    """A worker's segments: allocated for batch leaves, reused once released.

    Args:
      prefix: name prefix of this worker's segments (the consumer can find and
        unlink them by it if the worker is killed).
    """

    def __init__(self, prefix: str):
        self._prefix = prefix
        self._next_id = 0
        self._free: dict[int, list[_Segment]] = collections.defaultdict(list)
        self._lent: dict[int, _Segment] = {}
        # Arrays allocated for the output being built: id(array) -> segment.
        self._pending: dict[int, tuple[np.ndarray, _Segment]] = {}
        self._all: dict[int, _Segment] = {}

    @staticmethod
    def _round(nbytes: int) -> int:
        # Round sizes up so slightly different batches share segments.
        size = max(nbytes, 1)
        page = mmap.PAGESIZE
        return (size + page - 1) // page * page

    def _new_segment(self, size: int) -> _Segment:
        seg_id = self._next_id
        self._next_id += 1
        name = f"{self._prefix}{seg_id}"
        fd = _open(name, create=True)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        seg = _Segment(seg_id, name, size, mm)
        self._all[seg_id] = seg
        return seg

    def _take(self, nbytes: int) -> _Segment:
        size = self._round(nbytes)
        free = self._free.get(size)
        if free:
            return free.pop()
        return self._new_segment(size)

    def alloc(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """An array for a stacked leaf: in a segment if large, else ordinary memory."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < INLINE_LIMIT or dtype.hasobject:
            return np.empty(shape, dtype)
        seg = self._take(nbytes)
        arr = np.frombuffer(seg.mm, dtype=dtype, count=nbytes // dtype.itemsize).reshape(shape)
        self._pending[id(arr)] = (arr, seg)
        return arr

    def export(self, batch: Any) -> Any:
        """Replaces large array leaves with ``ShmLeaf``s (copying those not yet in a segment)."""

        def leaf(x: Any) -> Any:
            if not isinstance(x, np.ndarray):
                return x
            hit = self._pending.pop(id(x), None)
            if hit is not None and hit[0] is x:
                seg = hit[1]
            elif x.nbytes >= INLINE_LIMIT and not x.dtype.hasobject:
                seg = self._take(x.nbytes)
                dst = np.frombuffer(seg.mm, dtype=x.dtype, count=x.size).reshape(x.shape)
                np.copyto(dst, x)
            else:
                return x
            self._lent[seg.seg_id] = seg
            return ShmLeaf(seg.seg_id, seg.name, seg.size, x.shape, x.dtype.str)

        out = tree.map_structure(leaf, batch)
        # Leaves allocated but not part of the output (a batch_fn dropped them).
        for arr, seg in self._pending.values():
            self._free[seg.size].append(seg)
        self._pending.clear()
        return out

    def release(self, seg_ids) -> None:
        """The consumer no longer maps these segments: they can be reused."""
        for seg_id in seg_ids:
            seg = self._lent.pop(seg_id, None)
            if seg is not None:
                self._free[seg.size].append(seg)

    def unlink_all(self) -> None:
        """Removes the names of all segments (idempotent; mappings stay valid)."""
        for seg in self._all.values():
            unlink(seg.name)


class SegmentReader:
    """The consumer's side: turns ``ShmLeaf``s into arrays that own their mapping.

    Args:
      on_release: called with a segment id from whichever thread drops the last
        array of a mapping; it must only record the id (e.g. append to a deque).
    """

    def __init__(self, on_release: Callable[[int], None]):
        self._fds: dict[int, int] = {}
        self._on_release = on_release

    def _fd(self, leaf: ShmLeaf) -> int:
        fd = self._fds.get(leaf.seg_id)
        if fd is None:
            fd = _open(leaf.name, create=False)
            # The name has served its purpose: from here the segment lives exactly
            # as long as the mappings and descriptors that refer to it.
            unlink(leaf.name)
            self._fds[leaf.seg_id] = fd
        return fd

    def array(self, leaf: ShmLeaf) -> np.ndarray:
        mm = mmap.mmap(self._fd(leaf), leaf.size, flags=mmap.MAP_SHARED | _POPULATE)
        weakref.finalize(mm, self._on_release, leaf.seg_id)
        dtype = np.dtype(leaf.dtype)
        count = int(np.prod(leaf.shape, dtype=np.int64))
        return np.frombuffer(mm, dtype=dtype, count=count).reshape(leaf.shape)

    def materialize(self, batch: Any) -> Any:
        """``batch`` with every ``ShmLeaf`` replaced by its array."""
        return tree.map_structure(lambda x: self.array(x) if type(x) is ShmLeaf else x, batch)

    def close(self) -> None:
        """Closes the cached descriptors; arrays already handed out stay valid."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
