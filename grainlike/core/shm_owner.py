"""Named shared-memory segments in ``/dev/shm``: the space they need, and whose they are.

The only named segments grainlike makes are those of an ``InMemoryDataSource``
created with ``name=`` (grain's attach-by-name API); everything else lives in
anonymous memory (``core.memfd``), which ``/dev/shm``'s size does not limit
(where ``memfd_create`` is missing, it is a POSIX object unlinked at once,
which on Linux does count there; macOS has no ``/dev/shm``).

A segment's name is chosen by the user and ``/dev/shm`` is shared by every user of
the machine, so another user can create a segment under that name first. Every
named segment is therefore checked (``check_own``, on the open descriptor) to be
this user's and writable by nobody else before a byte of it is read. See
docs/security.md.
"""

from __future__ import annotations

import os
import stat
from typing import Optional

from grainlike.core.errors import SharedMemoryFullError, UnsafeSegmentError

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


def _user_name(uid: int) -> str:
    """``uid`` with its user name where the system knows it: ``65534 (nobody)``."""
    try:
        import pwd

        return f"{uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return str(uid)


def check_own(fd: int, name: str, what: str = "shared-memory segment") -> None:
    """Raises ``UnsafeSegmentError`` unless the open segment ``fd`` is this user's own.

    Checked on the descriptor that will be mapped, so the answer holds for the
    memory read (a name replaced after the check does not matter): a regular
    file, owned by this process's user (``os.getuid()``), writable by its owner
    only. Anything else could have been written by another user, who chose what
    it holds.

    Args:
      fd: the segment's descriptor.
      name: its name, for the message.
      what: what the segment is, for the message.

    Raises:
      UnsafeSegmentError: the segment is not a regular file, is another user's,
        or group or others may write it.
    """
    st = os.fstat(fd)
    uid = os.getuid()
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "is not a regular shared-memory object"
    elif st.st_uid != uid:
        problem = f"is owned by uid {_user_name(st.st_uid)}, not by this user (uid {_user_name(uid)})"
    elif st.st_mode & 0o022:
        problem = (
            f"has mode {stat.S_IMODE(st.st_mode):04o}: group or others can write it (grainlike "
            "creates its segments 0600)"
        )
    if problem is not None:
        raise UnsafeSegmentError(
            f"{what} {name!r} ({SHM_DIR}/{name.lstrip('/')}) {problem}; refusing to read it "
            "(another user could have chosen what it holds). Remove it if it is not "
            "yours to use (ask its owner), or pick another name."
        )
