"""Named shared-memory segments in ``/dev/shm``: the space they need.

The only named segments grainlike makes are those of an ``InMemoryDataSource``
created with ``name=`` (grain's attach-by-name API); everything else lives in
anonymous memory (``core.memfd``), which ``/dev/shm``'s size does not limit
(where ``memfd_create`` is missing, it is a POSIX object unlinked at once,
which on Linux does count there; macOS has no ``/dev/shm``).
"""

from __future__ import annotations

import os
from typing import Optional

from grainlike.core.errors import SharedMemoryFullError

SHM_DIR = "/dev/shm"


def _format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def free_bytes() -> Optional[int]:
    """Free space in ``/dev/shm`` for this user, or None where it cannot be told."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def full_error(what: str, size: int, free: Optional[int]) -> SharedMemoryFullError:
    """The error for a segment of ``size`` bytes that does not fit in ``/dev/shm``."""
    import errno

    free_text = "unknown" if free is None else _format_bytes(free)
    return SharedMemoryFullError(
        errno.ENOSPC,
        f"{what} needs {_format_bytes(size)} ({size} bytes) of shared memory in "
        f"{SHM_DIR}, which has {free_text} free. Give the machine or container more "
        "(docker run --shm-size=<size>, or a larger tmpfs on /dev/shm), free space "
        "there (other jobs' leftovers: ls -la /dev/shm), or leave out name=: an "
        "InMemoryDataSource without a name keeps its data in anonymous memory, "
        "which /dev/shm's size does not limit.",
    )


def check_free(what: str, size: int) -> None:
    """Raises ``SharedMemoryFullError`` before writing if ``size`` bytes do not fit."""
    free = free_bytes()
    if free is not None and size > free:
        raise full_error(what, size, free)


def reserve(fd: int, size: int, what: str) -> None:
    """Allocates the pages of a segment now, so that a full ``/dev/shm`` raises here.

    Without it, the first write to a page that does not fit kills the process
    with SIGBUS. Nothing is reserved where there is no ``posix_fallocate``
    (macOS, whose shared memory is not a size-limited ``/dev/shm``).
    """
    import errno

    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is None:
        return
    try:
        fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EFBIG):
            raise full_error(what, size, free_bytes()) from e
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
