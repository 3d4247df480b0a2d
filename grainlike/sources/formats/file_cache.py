"""The private local cache of remote files: whole copies in a directory, bounded in bytes.

ArrayRecord files are read this way (their reader opens local paths only), and
Parquet files too when ``RemoteOptions.cache_dir`` is given. See docs/security.md.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import stat
import tempfile
import threading
import time
from concurrent import futures
from typing import Iterator, Optional

from grainlike.core.errors import CacheFullError, RemoteReadError, UnsafeCacheDirError
from grainlike.sources.formats import remote_files as remote

__all__ = ["LocalCache", "cache_for", "default_cache_dir", "secure_directory"]


class LocalCache:
    """Whole copies of remote files in a local directory, bounded in bytes.

    The directory must be the user's own (created 0700; a symlink, another user's
    directory or one writable by group or others is refused with
    ``UnsafeCacheDirError``), and its files are opened relative to its descriptor
    with ``O_NOFOLLOW``, mode 0600. A copy is fetched by parallel ranged reads of
    one pinned version into a temporary name and renamed when complete; a sidecar
    (``.meta-<name>``) records the size and version it was fetched at, and a copy
    that does not match them is fetched again. A full disk raises ``CacheFullError``
    and leaves no partial file. Beyond ``max_bytes`` the least recently used copies
    are removed, except those ``pinned`` by any process sharing the directory.

    A copy killed halfway (SIGKILL, SIGTERM, a machine gone) leaves its partial
    file (``.partial-<name>-<pid>-<random>``). Partial files count against
    ``max_bytes`` while they exist, and the next fetch in any process (the first
    in each process, then every eviction) removes those that are this user's,
    unwritten for ``PARTIAL_IDLE_S`` seconds and whose copy's lock is free: every
    copy holds that lock from before its partial file exists until it is renamed
    or removed, so no process is writing them. See docs/security.md.

    Args:
      directory: where the copies live; created (0700) if missing.
      options: retries and block size of the ranged reads.
      max_bytes: the bound; None for none.
      private: also refuse a directory that group or others can read (the default
        directory, whose name anyone can guess, is private).

    Example:
        cache = LocalCache("/tmp/shards", remote.RemoteOptions(), max_bytes=10 << 30)
        local = cache.fetch("s3://bucket/train-00000-of-00008.array_record")
    """

    def __init__(
        self, directory: str, options: remote.RemoteOptions, max_bytes: Optional[int] = None, private: bool = False
    ):
        self._dir = os.path.abspath(directory)
        self._options = options
        self._max_bytes = max_bytes
        self._private = private
        self._lock = threading.Lock()

    @property
    def directory(self) -> str:
        return self._dir

    def _name(self, url: str, info: dict) -> str:
        digest = hashlib.sha1(f"{url}\0{info['size']}\0{info['version']}".encode()).hexdigest()[:20]
        base = re.sub(r"[^A-Za-z0-9._-]", "_", url.rstrip("/").rsplit("/", 1)[-1])[-80:]
        return f"{digest}-{base}"

    @contextlib.contextmanager
    def _opened_dir(self) -> Iterator[int]:
        fd = secure_directory(self._dir, private=self._private)
        try:
            yield fd
        finally:
            os.close(fd)

    def fetch(self, url: str, info: Optional[dict] = None) -> str:
        """Returns a local path holding the contents of ``url``, fetching it if needed.

        Args:
          url: the remote object.
          info: its ``object_info``, if known (the version to copy): a file already
            cached is then found without asking the store.

        Raises:
          UnsafeCacheDirError: the directory is not the user's own (see the class).
          CacheFullError: the disk under the directory is full.
          ObjectChangedError: the object changed from ``info`` while it was copied.
        """
        if info is None:
            info = remote.object_info(url, self._options)
        name = self._name(url, info)
        with self._opened_dir() as dir_fd:
            self._sweep_once(dir_fd)
            if _valid_copy(dir_fd, name, info):
                return os.path.join(self._dir, name)
            # One copy at a time per file, across the processes and threads sharing the
            # directory: the others wait here, then find it done.
            lock = _open_private(dir_fd, f".lock-{name}")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not _valid_copy(dir_fd, name, info):
                    self._copy(url, info, dir_fd, name)
            finally:
                os.close(lock)
            self._evict(dir_fd, keep=name)
        return os.path.join(self._dir, name)

    @contextlib.contextmanager
    def pinned(self, url: str, info: Optional[dict] = None) -> Iterator[str]:
        """``fetch``, and the copy stays until the block ends: open it inside.

        Another thread or process sharing the directory may evict the copy
        between ``fetch`` returning and the caller opening it; a pinned copy is
        skipped by every eviction (a shared lock on its lock file).
        """
        if info is None:
            info = remote.object_info(url, self._options)
        for _ in range(_PIN_ATTEMPTS):
            path = self.fetch(url, info)
            name = os.path.basename(path)
            with self._opened_dir() as dir_fd:
                lock = _open_private(dir_fd, f".lock-{name}")
            try:
                fcntl.flock(lock, fcntl.LOCK_SH)
                with self._opened_dir() as dir_fd:
                    valid = _valid_copy(dir_fd, name, info)
                if valid:
                    try:
                        yield path
                    finally:
                        os.close(lock)
                        lock = -1
                        # Copies kept over the bound while pinned go now (least
                        # recently used first; this one was just used).
                        with self._opened_dir() as dir_fd:
                            self._evict(dir_fd, keep=name)
                    return
            finally:
                if lock >= 0:
                    os.close(lock)
            # Evicted before the pin: fetched again.
        raise RemoteReadError(
            f"{url!r}: its local copy in {self._dir!r} was evicted {_PIN_ATTEMPTS} times before "
            "it could be opened; raise RemoteOptions.cache_max_bytes (it must hold the files "
            "read at the same time)",
            url,
        )

    def _copy(self, url: str, info: dict, dir_fd: int, name: str) -> None:
        size = info["size"]
        copied = False
        try:
            with _renamed_when_written(dir_fd, f".partial-{name}", name) as fd:
                bs = self._options.block_size
                ranges = [(s, min(s + bs, size)) for s in range(0, size, bs)]

                def copy(r: tuple[int, int]) -> None:
                    _write_all(fd, remote.read_range(url, r[0], r[1], self._options, info), r[0])

                # Blocks of one file in parallel: remote latency, not bandwidth, bounds
                # a single ranged read. Every block is of the pinned version.
                pending = [remote._pool("copy").submit(copy, r) for r in ranges]
                try:
                    for f in pending:
                        f.result()
                finally:
                    # No block may still write to ``fd`` once it is closed (its number
                    # could by then name another file).
                    for f in pending:
                        f.cancel()
                    futures.wait(pending)
            copied = True
            # The sidecar records the size and version the copy was fetched at.
            with _renamed_when_written(dir_fd, f".partial-meta-{name}", f".meta-{name}") as fd:
                record = {"url": url, "size": size, "version": info["version"], "etag": info.get("etag")}
                _write_all(fd, json.dumps(record).encode())
        except OSError as e:
            if copied:
                # Without its sidecar the copy would be fetched again anyway.
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dir_fd)
            if e.errno in (errno.ENOSPC, errno.EDQUOT) and not isinstance(e, RemoteReadError):
                raise CacheFullError(
                    e.errno,
                    f"{url!r}: no space left to cache it ({size} bytes) in {self._dir!r}: {e}. "
                    "No partial copy was kept. Free space there, lower "
                    "RemoteOptions.cache_max_bytes, or pass a directory on a larger disk as "
                    "RemoteOptions(cache_dir=...).",
                ) from e
            raise

    def _sweep_once(self, dir_fd: int) -> None:
        """Removes the partial files killed copies left, on this process's first fetch from the directory."""
        key = (os.getpid(), self._dir)
        with _SWEPT_LOCK:
            if key in _SWEPT:
                return
            _SWEPT.add(key)
        with self._lock:
            _scan(dir_fd)

    def _evict(self, dir_fd: int, keep: str) -> None:
        if self._max_bytes is None:
            return
        with self._lock:
            entries, partial_bytes = _scan(dir_fd)
            # Partial files take the disk as much as copies do (a live copy's, or one
            # not yet removable): they count, though only copies are evicted.
            total = partial_bytes + sum(size for _, size, _ in entries)
            for _, size, name in sorted(entries):
                if total <= self._max_bytes:
                    break
                if name != keep and _remove_unpinned(dir_fd, name):
                    total -= size


# Fetches of one file before its copy could be pinned, when other readers keep
# evicting it (a cache bound smaller than the files read at the same time).
_PIN_ATTEMPTS = 20
_SIDECAR_MAX_BYTES = 1 << 16

# A copy's (or its sidecar's) file while it is written: ``_renamed_when_written``'s
# ``<prefix>-<pid>-<8 hex digits>``; group 1 is the cached name whose lock covers it.
_PARTIAL = re.compile(r"\.partial-(?:meta-)?(.+)-\d+-[0-9a-f]{8}")
# Seconds a partial file must have gone unwritten before it is removed (with its
# copy's lock free). The lock alone tells on one machine; this also keeps a copy
# running on another machine that shares the directory over a filesystem whose
# locks do not reach it (a live copy writes its file continually).
PARTIAL_IDLE_S = 60.0
# (pid, directory) of the sweeps done: one per process and directory.
_SWEPT: set = set()
_SWEPT_LOCK = threading.Lock()


def _scan(dir_fd: int) -> tuple[list, int]:
    """The cached copies ``(mtime, size, name)`` and the bytes of the partial files left.

    Partial files of killed copies are removed on the way (``_remove_stale_partial``).
    """
    entries = []
    partial_bytes = 0
    now = time.time()
    for name in os.listdir(dir_fd):
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        if not name.startswith("."):
            entries.append((st.st_mtime, st.st_size, name))
            continue
        match = _PARTIAL.fullmatch(name)
        if match is None or _remove_stale_partial(dir_fd, name, match.group(1), st, now):
            continue
        # The blocks written so far (a copy writes its blocks out of order: the
        # size is the furthest one's end).
        blocks = getattr(st, "st_blocks", None)
        partial_bytes += st.st_size if blocks is None else min(st.st_size, blocks * 512)
    return entries, partial_bytes


def _remove_stale_partial(dir_fd: int, partial: str, name: str, st: os.stat_result, now: float) -> bool:
    """Removes ``partial`` if a killed copy left it; never another user's, nor one being written.

    Removed only if it is this user's, unwritten for ``PARTIAL_IDLE_S`` seconds,
    and the lock of its copy (``.lock-<name>``, which every copy holds while its
    partial files exist) is free now; checked again under that lock.
    """
    if st.st_uid != os.geteuid() or now - st.st_mtime < PARTIAL_IDLE_S:
        return False
    try:
        lock = _open_private(dir_fd, f".lock-{name}")
    except OSError:
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        again = os.stat(partial, dir_fd=dir_fd, follow_symlinks=False)
        if (again.st_ino, again.st_dev, again.st_mtime_ns) != (st.st_ino, st.st_dev, st.st_mtime_ns):
            return False
        os.unlink(partial, dir_fd=dir_fd)
        return True
    except OSError:
        return False  # The lock is held (a copy is running), or the file went meanwhile.
    finally:
        os.close(lock)  # Releases the lock.


def secure_directory(path: str, private: bool = False) -> int:
    """Opens the cache directory ``path`` (creating it 0700), checked to be the user's own.

    Returns:
      A descriptor of the directory (the caller closes it); files are opened
      relative to it so no later path lookup goes through a link.

    Raises:
      UnsafeCacheDirError: ``path`` is a symlink or not a directory, is owned by
        another user, or is writable (``private``: accessible) by group or others.
    """
    parent = os.path.dirname(path)
    if parent and not os.path.isdir(parent):
        os.makedirs(parent, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    fix = (
        f"Remove it (if it is not yours, ask who made it) or pass a directory of your own as "
        f"RemoteOptions(cache_dir=...)."
    )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeCacheDirError(
                f"remote file cache {path!r} is a symlink or not a directory; refusing to use it "
                f"(another user could redirect it). {fix}"
            ) from e
        raise
    st = os.fstat(fd)
    problem = None
    if st.st_uid != os.geteuid():
        problem = f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    elif private and st.st_mode & 0o077 and not st.st_mode & 0o022:
        # Ours and writable by us alone (as earlier versions made the default
        # directory, 0755): nobody else could have put anything in it, so it is
        # made private rather than refused.
        os.fchmod(fd, 0o700)
    elif st.st_mode & (0o077 if private else 0o022):
        problem = (
            f"has mode {stat.S_IMODE(st.st_mode):04o}: "
            f"{'group or others can reach it' if private else 'group or others can write it'} "
            f"(it must be {'0700' if private else 'writable by its owner only'})"
        )
    if problem is not None:
        os.close(fd)
        raise UnsafeCacheDirError(
            f"remote file cache {path!r} {problem}; refusing to use it (its copies or locks "
            f"could be another user's). {fix}"
        )
    return fd


def _open_private(dir_fd: int, name: str, create_new: bool = False, write: bool = False) -> int:
    """Opens (creating, 0600) ``name`` in the directory, never through a symlink."""
    flags = os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_WRONLY if write else os.O_RDWR)
    if create_new:
        flags |= os.O_EXCL
    return os.open(name, flags, 0o600, dir_fd=dir_fd)


def _write_all(fd: int, data: bytes, offset: Optional[int] = None) -> None:
    """Writes all of ``data`` (at ``offset``, else at the file's position); a write of 0 is ENOSPC."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.ENOSPC, "write made no progress (disk full?)")
        view = view[n:]
        offset = None if offset is None else offset + n


@contextlib.contextmanager
def _renamed_when_written(dir_fd: int, prefix: str, name: str) -> Iterator[int]:
    """A new private file to write, synced and renamed to ``name`` after the block (removed if it raises)."""
    tmp = f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}"
    fd = _open_private(dir_fd, tmp, create_new=True, write=True)
    try:
        yield fd
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        tmp = None
    finally:
        if fd >= 0:
            os.close(fd)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)


def _valid_copy(dir_fd: int, name: str, info: dict) -> bool:
    """Whether ``name`` is a file of the object's size whose sidecar records its version (marked recently used)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_size != info["size"]:
            return False
        fd = os.open(f".meta-{name}", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            record = json.loads(os.read(fd, _SIDECAR_MAX_BYTES))
        finally:
            os.close(fd)
        if record.get("size") != info["size"] or record.get("version") != info["version"]:
            return False
        os.utime(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except (OSError, ValueError):
        return False


def _remove_unpinned(dir_fd: int, name: str) -> bool:
    """Removes a cached copy unless it is pinned or being fetched (never waits)."""
    try:
        fd = _open_private(dir_fd, f".lock-{name}")
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.unlink(name, dir_fd=dir_fd)
        with contextlib.suppress(OSError):
            os.unlink(f".meta-{name}", dir_fd=dir_fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # Releases the lock.


def default_cache_dir() -> str:
    """The cache directory used when ``RemoteOptions.cache_dir`` is None.

    ``$TMPDIR/grainlike-remote-cache-<uid>``: a guessable name, so it is used only
    if it is this user's own, mode 0700 (see ``LocalCache``).
    """
    return os.path.join(tempfile.gettempdir(), f"grainlike-remote-cache-{os.getuid()}")


def cache_for(options: remote.RemoteOptions) -> LocalCache:
    """The cache ``options`` describe (the default directory when it names none)."""
    if options.cache_dir is None:
        return LocalCache(default_cache_dir(), options, options.cache_max_bytes, private=True)
    return LocalCache(options.cache_dir, options, options.cache_max_bytes)
