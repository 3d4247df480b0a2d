"""Named POSIX shared-memory segments (``grainlike.sources.in_memory``): create, attach, unlink, map.

Other processes attach a segment by name without registering it with
multiprocessing's resource tracker (which would unlink it when they exit).
Segments are created 0600, and one is attached, or unlinked by a process that
did not create it, only if it is this user's and nobody else may write it
(``shm_owner.check_own``): ``/dev/shm`` is shared by all users, and another
could create a segment under the name first.
"""

from __future__ import annotations

import os
import sys
import threading
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from grainlike.core import shm_owner

try:  # POSIX only; used to unlink a segment that this process did not create.
    import _posixshmem
except ImportError:  # pragma: no cover - non-POSIX platforms
    _posixshmem = None

__all__ = ["SegmentMapping", "attach_untracked", "create_reserved", "unlink_owned", "unlink_untracked"]

_tracker_lock = threading.Lock()


def attach_untracked(name: str, what: str = "shared-memory segment") -> shared_memory.SharedMemory:
    """Maps an existing segment of this user's without registering it with the resource tracker.

    Python < 3.13 registers every ``SharedMemory(name=...)``, and the tracker unlinks
    it when this process exits, destroying it for the owner; unregistering afterwards
    would also drop the owner's entry (one per name, in a tracker shared with the parent).

    Raises:
      FileNotFoundError: no segment has this name.
      UnsafeSegmentError: the segment is another user's or writable by others
        (see ``shm_owner.check_own``); nothing of it was read.
    """
    shm = _attach(name)
    try:
        shm_owner.check_own(shm._fd, name, what)
    except BaseException:
        shm.close()
        raise
    return shm


def _attach(name: str) -> shared_memory.SharedMemory:
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    with _tracker_lock:
        original = resource_tracker.register

        def register(rname: str, rtype: str) -> None:
            if rtype == "shared_memory" and rname.lstrip("/") == name:
                return
            original(rname, rtype)

        resource_tracker.register = register
        try:
            return shared_memory.SharedMemory(name=name)
        finally:
            resource_tracker.register = original


def create_reserved(name: str, size: int, what: str) -> shared_memory.SharedMemory:
    """A new named segment of ``size`` bytes, its pages reserved (a full ``/dev/shm`` raises here)."""
    shm_owner.check_free(what, size)
    shm = shared_memory.SharedMemory(name=name, create=True, size=size)
    try:
        # Created exclusively (O_EXCL), so it is ours; 0600 whatever the default.
        os.fchmod(shm._fd, 0o600)
        shm_owner.reserve(shm._fd, size, what)
    except BaseException:
        shm.close()
        shm.unlink()
        raise
    return shm


def unlink_owned(shm: shared_memory.SharedMemory, pid: int) -> None:
    """Finalizer of an owner: removes the segment's name (mappings stay valid)."""
    if os.getpid() != pid:
        return  # A forked copy of the owner: the segment belongs to the parent.
    try:
        shm.unlink()
    except FileNotFoundError:
        pass  # Someone already removed the name.


def unlink_untracked(name: str) -> None:
    """Removes the name of a segment of this user's that this process did not create.

    Raises:
      UnsafeSegmentError: the segment is another user's (it is left alone).
    """
    # SharedMemory.unlink() would also unregister the name from the (shared)
    # resource tracker, which never heard of it from this process.
    if _posixshmem is None:  # pragma: no cover - non-POSIX platforms
        return
    try:
        fd = _posixshmem.shm_open("/" + name, os.O_RDONLY | os.O_NOFOLLOW, 0o600)
    except FileNotFoundError:
        return
    try:
        shm_owner.check_own(fd, name)
    finally:
        os.close(fd)
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass


class SegmentMapping:
    """Owns one process's mapping of a segment; the ``.base`` of every array on it.

    Arrays are built from ``__array_interface__`` (a raw pointer) instead of the
    buffer protocol, so ``SharedMemory.close()`` never fails on exported buffers;
    the mapping is closed only here, when the last array referencing it is gone.
    """

    __slots__ = ("_shm", "__array_interface__", "__weakref__")

    def __init__(self, shm: shared_memory.SharedMemory):
        self._shm = shm
        probe = np.frombuffer(shm.buf, np.uint8)
        pointer = probe.ctypes.data
        del probe  # Releases the buffer export, so close() can succeed later.
        self.__array_interface__ = {
            "shape": (shm.size,),
            "typestr": "|u1",
            "data": (pointer, True),  # Read-only: the pages are shared by all processes.
            "version": 3,
        }

    def __del__(self):
        try:
            self._shm.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass
