"""Anonymous shared memory: segments without a name, mapped without keeping a descriptor.

A segment is a ``memfd_create`` file: no name in ``/dev/shm`` (no other job can see
or delete it), not limited by ``/dev/shm``'s size, and gone with its last
descriptor and mapping, even when every process is killed at once. Mappings are
made with ``mmap(2)`` through ctypes, not ``mmap.mmap`` (a descriptor per mapping),
so holding any number of arrays costs no descriptors. Without ``memfd_create``
(macOS, the BSDs) a segment is a POSIX shared-memory object created exclusively
(0600) under a private name and unlinked at once; it cannot be sealed, so a
read-only segment is handed out as a read-only descriptor.

Worker shipment: objects pickled inside ``shipping()`` hand their descriptor to
``ship(token, fd)`` and pickle only the token; the pool sends the descriptors with
the pipeline, the worker calls ``receive()`` before unpickling, and ``shipped(token)``
finds them. Outside ``shipping()``, ``ship`` returns False.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import threading
import weakref
from typing import Any, Callable, Iterator, Mapping, Optional

import numpy as np

try:  # POSIX shared-memory objects: the segments where memfd_create is missing.
    import _posixshmem
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_libc: Any = None
# F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL: the contents can never change.
_SEALS = 0x0008 | 0x0004 | 0x0002 | 0x0001
_F_ADD_SEALS = 1033


def _lib() -> Any:
    """libc's ``mmap``/``munmap`` through ctypes (loaded on first use)."""
    global _libc
    if _libc is None:
        import ctypes

        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
        ]
        lib.munmap.restype = ctypes.c_int
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc = (lib, ctypes.c_void_p(-1).value, ctypes.get_errno)
    return _libc


def available() -> bool:
    """Whether anonymous segments can be made and mapped on this platform."""
    if not hasattr(os, "memfd_create") and _posixshmem is None:
        return False
    try:
        _lib()
    except (ImportError, OSError, AttributeError):
        return False
    return True


class Region:
    """One mapping of a segment, holding no descriptor; unmapped when the last reference goes.

    ``np.asarray(region)`` is a uint8 array over the whole segment whose
    ``.base`` is the region, so arrays on it keep it mapped. A read-only region
    gives read-only arrays (and its pages cannot be written at all).
    """

    __slots__ = ("size", "__array_interface__", "__weakref__")

    def __init__(self, fd: int, size: int, populate: bool = False, writable: bool = True):
        lib, failed, get_errno = _lib()
        flags = mmap.MAP_SHARED | (_POPULATE if populate else 0)
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        address = lib.mmap(None, size, prot, flags, fd, 0)
        if address is None or address == failed:
            err = get_errno()
            raise OSError(err, f"cannot map a shared-memory segment of {size} bytes: {os.strerror(err)}")
        self.size = size
        self.__array_interface__ = {
            "shape": (size,),
            "typestr": "|u1",
            "data": (address, not writable),
            "version": 3,
        }
        # Not at exit: arrays may be in use until the very end, and the process's
        # mappings go with it anyway.
        weakref.finalize(self, lib.munmap, address, size).atexit = False


@contextlib.contextmanager
def _closed_on_error(fd: int) -> Iterator[None]:
    """Closes ``fd`` if the block raises."""
    try:
        yield
    except BaseException:
        os.close(fd)
        raise


def _unlinked_object(read_only_too: bool) -> tuple[int, Optional[int]]:
    """A new, empty POSIX shared-memory object whose name is already gone.

    Returns:
      ``(a read-write descriptor, a read-only one or None)``, both close-on-exec.
    """
    for _ in range(16):
        path = f"/grainlike-{os.getpid()}-{secrets.token_hex(4)}"  # 27 bytes: macOS allows 31.
        try:
            # O_EXCL: a name someone else holds is never opened, only skipped.
            fd = _posixshmem.shm_open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        try:
            with _closed_on_error(fd):
                read_only = _posixshmem.shm_open(path, os.O_RDONLY, 0o600) if read_only_too else None
        finally:
            _posixshmem.shm_unlink(path)
        for d in (fd, read_only):
            if d is not None:
                os.set_inheritable(d, False)
        return fd, read_only
    raise FileExistsError(f"no free shared-memory name of the form /grainlike-{os.getpid()}-<random> after 16 tries")


def new_fd(size: int, name: str) -> int:
    """The read-write descriptor of a new anonymous segment of ``size`` bytes (zeros).

    ``name`` names a memfd segment (``/proc/<pid>/fd`` shows it); the
    fallback's name is private and gone by the time this returns.
    """
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
    else:
        fd, _ = _unlinked_object(read_only_too=False)
    with _closed_on_error(fd):
        os.ftruncate(fd, size)
    return fd


def new_segment(size: int, name: str = "grainlike-batch") -> tuple[int, Region]:
    """A new anonymous segment of ``size`` bytes: ``(its descriptor, a writable mapping of it)``."""
    fd = new_fd(size, name)
    with _closed_on_error(fd):
        return fd, Region(fd, size)


def sealed_segment(size: int, fill: Callable[[np.ndarray], None], name: str) -> tuple[int, Region]:
    """A segment written once by ``fill`` (a writable uint8 array it must not keep), then made unchangeable.

    The segment is sealed where the kernel allows it and mapped read-only; without
    ``memfd_create`` the descriptor returned is one opened read-only.

    Returns:
      ``(its descriptor, a read-only mapping)``; the caller closes the descriptor.
    """
    if not hasattr(os, "memfd_create"):
        return _sealed_unlinked_object(size, fill)
    fd = os.memfd_create(name, os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 0))
    with _closed_on_error(fd):
        _fill(fd, size, fill)
        try:
            import fcntl

            fcntl.fcntl(fd, getattr(fcntl, "F_ADD_SEALS", _F_ADD_SEALS), _SEALS)
        except OSError:
            pass  # No sealing (old kernel): the read-only mappings still protect it.
        return fd, Region(fd, size, writable=False)


def _fill(fd: int, size: int, fill: Callable[[np.ndarray], None]) -> None:
    """Sizes the segment of ``fd`` and writes it through a mapping unmapped before returning."""
    os.ftruncate(fd, size)
    # mmap.mmap rather than a Region: close() unmaps now, and a write seal
    # is refused while any writable mapping exists.
    writable = mmap.mmap(fd, size)
    try:
        view = np.frombuffer(writable, np.uint8)
        fill(view)
        del view
    finally:
        writable.close()


def _sealed_unlinked_object(size: int, fill: Callable[[np.ndarray], None]) -> tuple[int, Region]:
    """``sealed_segment`` where there is no memfd_create (see there)."""
    fd, read_only = _unlinked_object(read_only_too=True)
    with _closed_on_error(read_only):
        try:
            _fill(fd, size, fill)
        finally:
            os.close(fd)
        return read_only, Region(read_only, size, writable=False)


# ---------------------------------------------------------------------------
# Descriptors travelling with a pickled worker pipeline.

_collecting = threading.local()
# In a worker: token -> descriptor, for the life of the process (a pipeline may
# be unpickled again after a worker_init_fn ran).
_received: dict = {}


@contextlib.contextmanager
def shipping() -> Iterator[dict]:
    """Collects the descriptors of the segments that objects pickled in this thread ship.

    Yields:
      A dict ``token -> descriptor``, filled while the block pickles; the
      descriptors are duplicates that the caller owns and closes (they are
      closed here if the block raises).
    """
    outer = getattr(_collecting, "fds", None)
    fds: dict = {}
    _collecting.fds = fds
    try:
        yield fds
    except BaseException:
        close_all(fds)
        raise
    finally:
        _collecting.fds = outer


def ship(token: str, fd: int) -> bool:
    """Adds ``fd`` to the shipment being pickled in this thread; False if there is none."""
    fds = getattr(_collecting, "fds", None)
    if fds is None:
        return False
    if token not in fds:
        fds[token] = os.dup(fd)
    return True


def close_all(fds: dict) -> None:
    """Closes the descriptors of a shipment (and empties it)."""
    items = list(fds.values())
    fds.clear()
    for fd in items:
        try:
            os.close(fd)
        except OSError:
            pass


def receive(fds: Mapping[str, int]) -> None:
    """In a worker: makes the descriptors shipped with its pipeline available to ``shipped``."""
    _received.update(fds)


def shipped(token: str) -> Optional[int]:
    """The descriptor shipped to this process under ``token``, or None."""
    return _received.get(token)
