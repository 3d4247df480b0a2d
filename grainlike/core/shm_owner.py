"""Named shared-memory segments whose owner can be verified, and the space they need.

A name made by ``owned_name`` carries its creator's identity: pid, PID-namespace
inode and process start time (``grainlike_src_<pid>_<ns>_<start>_<random>``).
``sweep_orphans`` removes a segment only when that identity proves its owner is
dead: same PID namespace (so ``/proc`` shows the owner if it lives), same user,
and no process with that pid and start time. Segments of other namespaces
(containers sharing ``/dev/shm``), of other users, or with names it cannot parse
are never touched.
"""

from __future__ import annotations

import os
import secrets
from typing import Optional

SHM_DIR = "/dev/shm"
# The prefix of InMemoryDataSource segments, the only named ones.
SOURCE_PREFIX = "grainlike_src_"


def _stat_start_time(pid: int) -> Optional[int]:
    """Field 22 of ``/proc/<pid>/stat``: the start time in clock ticks since boot."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        return int(data.rsplit(b")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def _pid_namespace() -> Optional[int]:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def owned_name(prefix: str) -> str:
    """A fresh segment name under ``prefix`` that records this process as its owner."""
    pid = os.getpid()
    ns = _pid_namespace() or 0
    start = _stat_start_time(pid) or 0
    return f"{prefix}{pid}_{ns}_{start}_{secrets.token_hex(4)}"


def _owner_dead(name: str, prefix: str, ns: int, uid: int) -> bool:
    """Whether ``name`` (under ``prefix``) provably belongs to a process that is gone."""
    parts = name[len(prefix):].split("_")
    if len(parts) != 4 or not all(p.isdigit() for p in parts[:3]):
        return False  # Not a name this module made: nothing can be verified.
    pid, name_ns, start = (int(p) for p in parts[:3])
    if name_ns != ns or pid == os.getpid():
        return False
    try:
        if os.stat(os.path.join(SHM_DIR, name)).st_uid != uid:
            return False
    except OSError:
        return False
    live_start = _stat_start_time(pid)
    # Same namespace: /proc lists the owner if it lives. A pid reused by another
    # process has another start time.
    return live_start is None or live_start != start


def sweep_orphans(prefix: str) -> int:
    """Unlinks segments under ``prefix`` whose owner is provably dead; returns how many."""
    ns = _pid_namespace()
    if ns is None:
        return 0
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(prefix)]
    except OSError:
        return 0
    uid = os.getuid()
    count = 0
    for name in names:
        if _owner_dead(name, prefix, ns, uid):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                count += 1
            except OSError:
                pass  # Removed meanwhile, or not ours to remove after all.
    return count


class SharedMemoryFullError(OSError):
    """There is not enough free space in ``/dev/shm`` for a segment."""


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
        "there (other jobs' leftovers: ls -la /dev/shm), or keep the data in an "
        "ordinary source (a list or a file source) instead.",
    )


def check_free(what: str, size: int) -> None:
    """Raises ``SharedMemoryFullError`` before writing if ``size`` bytes do not fit."""
    free = free_bytes()
    if free is not None and size > free:
        raise full_error(what, size, free)


def reserve(fd: int, size: int, what: str) -> None:
    """Allocates the pages of a segment now, so that a full ``/dev/shm`` raises here.

    Without it, the first write to a page that does not fit kills the process
    with SIGBUS.
    """
    import errno

    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EFBIG):
            raise full_error(what, size, free_bytes()) from e
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
