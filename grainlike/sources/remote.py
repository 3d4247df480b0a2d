"""Remote files for the file sources: ``s3://``, ``gs://``, ``file://`` through fsspec.

Three ways a source reads a remote object, all with the same retries and errors:

* ``RemoteFile``: a seekable, read-only file object doing ranged reads, one block
  (``RemoteOptions.block_size``) at a time, with read-ahead threads fetching the
  next blocks while the caller works on this one (remote latency is where threads
  pay). Parquet files are read through it.
* ``LocalCache.fetch``: the whole object copied once into a local directory by
  parallel ranged reads, bounded in bytes (least recently used files go first).
  ArrayRecord files are read this way (their reader opens local paths only), and
  Parquet files too when a cache directory is given.
* ``with_retries``: transient failures (lost connections, timeouts, throttling) are
  retried with exponential backoff; then ``RemoteReadError`` names the object.
  Missing objects raise ``FileNotFoundError`` and missing or refused credentials
  ``RemoteAccessError`` (a ``PermissionError``) at once, naming the object.

Filesystems are created lazily, once per process (never pickled): a source sent
to a worker process opens its own connections there. ``fsspec`` and the
filesystem's package (``s3fs``, ``gcsfs``) are imported only when a remote path
is read: ``pip install "grainlike[remote]"``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import io
import os
import re
import tempfile
import threading
import time
from collections import OrderedDict
from concurrent import futures
from typing import Any, Callable, Iterator, Optional, TypeVar

__all__ = [
    "LocalCache",
    "RemoteAccessError",
    "RemoteFile",
    "RemoteOptions",
    "RemoteReadError",
    "is_remote",
    "open_input",
    "pinned_input",
    "to_url",
    "with_retries",
]

T = TypeVar("T")

_LOCAL_PROTOCOLS = ("file", "local")
# Exception class names (anywhere in the MRO) of failures worth retrying: lost or
# refused connections, timeouts, throttling and unavailable services, from
# botocore, aiohttp, requests, google-cloud and fsspec alike.
_TRANSIENT_NAME = re.compile(
    r"Connection|Timeout|Throttl|SlowDown|ServiceUnavailable|TooManyRequests|"
    r"ServerDisconnected|IncompleteRead|ResponseStreamingError|ProtocolError"
)
_TRANSIENT_TEXT = re.compile(
    r"SlowDown|Throttl|Too Many Requests|\b503\b|\b429\b|\b500\b|ServiceUnavailable|"
    r"RequestTimeout|Connection (reset|refused|aborted)|Could not connect"
)
_CREDENTIALS_NAME = re.compile(r"Credential|Unauthenticated|Forbidden|AccessDenied|RefreshError")


class RemoteAccessError(PermissionError):
    """Credentials are missing or the store refused them; the message names the object."""


class RemoteReadError(OSError):
    """A remote read still failed after its retries; the message names the object."""


@dataclasses.dataclass(frozen=True)
class RemoteOptions:
    """How remote objects are reached, retried, read ahead and cached.

    Attributes:
      storage_options: keyword arguments of the fsspec filesystem, e.g.
        ``{"endpoint_url": "http://localhost:9000", "key": ..., "secret": ...}``
        for ``s3fs`` or ``{"token": "anon"}`` for ``gcsfs``. Credentials are
        otherwise found as the filesystem's package finds them (environment,
        ``~/.aws``, metadata server).
      attempts: tries per read before ``RemoteReadError`` (at least 1).
      backoff_s: wait after the first failed try; doubled after each one.
      max_backoff_s: the longest wait between two tries.
      block_size: bytes per ranged read.
      read_ahead: blocks fetched ahead, in threads, while a file is read in order.
      cache_dir: a local directory that keeps whole copies of remote files. ArrayRecord
        files always go through a cache (a temporary directory when this is None);
        Parquet files do only when this is set.
      cache_max_bytes: bound of the cache; least recently used files are removed
        beyond it, except while a reader is opening them (it may be exceeded by
        the files opened at the same time). None: unbounded.

    Example:
        options = RemoteOptions(storage_options={"anon": True}, cache_dir="/tmp/shards",
                                cache_max_bytes=20 << 30)
    """

    storage_options: Optional[dict] = None
    attempts: int = 5
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    block_size: int = 4 << 20
    read_ahead: int = 4
    cache_dir: Optional[str] = None
    cache_max_bytes: Optional[int] = None

    def __post_init__(self):
        if self.attempts < 1:
            raise ValueError(f"RemoteOptions.attempts must be >= 1, got {self.attempts}")
        if self.block_size < 1:
            raise ValueError(f"RemoteOptions.block_size must be >= 1, got {self.block_size}")
        if self.read_ahead < 0:
            raise ValueError(f"RemoteOptions.read_ahead must be >= 0, got {self.read_ahead}")
        if self.cache_max_bytes is not None and self.cache_max_bytes < 0:
            raise ValueError(
                f"RemoteOptions.cache_max_bytes must be >= 0 or None, got {self.cache_max_bytes}"
            )

    def _key(self) -> str:
        return repr(sorted((self.storage_options or {}).items()))


def to_url(path: Any) -> str:
    """``path`` as a string: a ``str``, an ``os.PathLike`` or an etils ``epath.Path``."""
    if isinstance(path, str):
        return path
    if isinstance(path, os.PathLike):
        return os.fspath(path)
    raise TypeError(f"expected a path (str or os.PathLike), got {path!r} of type {type(path).__name__}")


def _protocol(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else "file"


def is_remote(path: Any) -> bool:
    """Whether ``path`` names an object that fsspec reads (not a local file)."""
    return _protocol(to_url(path)) not in _LOCAL_PROTOCOLS


def local_path(path: Any) -> str:
    """A local path or ``file://`` URL as a plain path."""
    url = to_url(path)
    return url.split("://", 1)[1] if "://" in url else url


# -- filesystems, one per process -----------------------------------------------

_FS_LOCK = threading.Lock()
_FILESYSTEMS: dict = {}
_FS_PID = os.getpid()


def _filesystem(url: str, options: RemoteOptions) -> Any:
    global _FS_PID
    protocol = _protocol(url)
    key = (protocol, options._key())
    with _FS_LOCK:
        if _FS_PID != os.getpid():
            # A forked child must not share the parent's connections or event loop.
            _FILESYSTEMS.clear()
            _FS_PID = os.getpid()
        fs = _FILESYSTEMS.get(key)
        if fs is None:
            try:
                import fsspec  # pylint: disable=g-import-not-at-top
            except ImportError as e:
                raise ImportError(
                    f"reading {url!r} needs fsspec and its filesystem for {protocol!r}: "
                    'pip install "grainlike[remote]" (s3fs for s3://, gcsfs for gs://)'
                ) from e
            try:
                fs = fsspec.filesystem(protocol, **(options.storage_options or {}))
            except ImportError as e:
                raise ImportError(f"reading {url!r}: {e}") from e
            _FILESYSTEMS[key] = fs
    return fs


def _fs_path(url: str) -> str:
    return url.split("://", 1)[1] if "://" in url else url


# -- retries and errors -----------------------------------------------------------


def _names(e: BaseException) -> str:
    return " ".join(c.__name__ for c in type(e).__mro__)


def _is_credentials_error(e: BaseException) -> bool:
    if isinstance(e, PermissionError) or _CREDENTIALS_NAME.search(_names(e)):
        return True
    # gcsfs raises a refusal as a plain OSError("Forbidden: ...") (403) or an
    # HttpError carrying the status (401), with no telling class name.
    return getattr(e, "code", None) in (401, 403) or str(e).startswith("Forbidden:")


def _is_transient(e: BaseException) -> bool:
    if isinstance(e, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(e, (ConnectionError, TimeoutError)):
        return True
    return bool(_TRANSIENT_NAME.search(_names(e)) or _TRANSIENT_TEXT.search(str(e)))


def with_retries(fn: Callable[[], T], url: str, what: str, options: RemoteOptions) -> T:
    """Returns ``fn()``, retrying transient failures with exponential backoff.

    Args:
      fn: the remote operation (no arguments).
      url: the object it touches, named in errors.
      what: what it does ("read bytes 0-4096 of", "list"), named in errors.
      options: attempts and backoff.

    Raises:
      FileNotFoundError: the object does not exist.
      RemoteAccessError: credentials are missing or refused.
      RemoteReadError: still failing after ``options.attempts`` tries.
    """
    delay = options.backoff_s
    for attempt in range(1, options.attempts + 1):
        try:
            return fn()
        except FileNotFoundError as e:
            raise FileNotFoundError(f"{url!r}: no such object ({what}): {e}") from e
        except Exception as e:  # pylint: disable=broad-except
            if _is_credentials_error(e) and not _is_transient(e):
                raise RemoteAccessError(
                    f"{url!r}: access denied or no credentials ({what}): {type(e).__name__}: {e}. "
                    "Set the store's credentials (for s3://: AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY or a profile; for gs://: "
                    "GOOGLE_APPLICATION_CREDENTIALS), or pass them in "
                    "RemoteOptions(storage_options=...)."
                ) from e
            if not _is_transient(e):
                raise
            if attempt == options.attempts:
                raise RemoteReadError(
                    f"{url!r}: failed to {what} after {attempt} attempts: "
                    f"{type(e).__name__}: {e}"
                ) from e
            time.sleep(delay)
            delay = min(delay * 2, options.max_backoff_s)
    raise AssertionError("unreachable")


# -- read-ahead threads, one pool per process -----------------------------------

_POOL_LOCK = threading.Lock()
_POOLS: dict = {}
_POOL_PID = 0
_POOL_THREADS = 16


def _pool(kind: str = "read") -> futures.ThreadPoolExecutor:
    """The process's threads of one kind, made on first use.

    ``"read"`` runs block reads and fetches ahead; ``"copy"`` the ranged reads of
    a whole-file copy, which a fetch on a "read" thread waits for: two pools, so
    that waiting never holds the threads the awaited work needs.
    """
    global _POOL_PID
    with _POOL_LOCK:
        if _POOL_PID != os.getpid():
            # Pools inherited through fork have no threads behind them: make new ones.
            _POOLS.clear()
            _POOL_PID = os.getpid()
        pool = _POOLS.get(kind)
        if pool is None:
            pool = futures.ThreadPoolExecutor(_POOL_THREADS, thread_name_prefix=f"grainlike-remote-{kind}")
            _POOLS[kind] = pool
        return pool


def submit(fn: Callable[..., Any], *args: Any) -> futures.Future:
    """Runs ``fn(*args)`` on the process's read-ahead threads (fetches ahead of need)."""
    return _pool().submit(fn, *args)


# What this process last learnt of each object: url -> {"size", "version"}.
_INFOS: dict = {}


def object_info(url: str, options: RemoteOptions) -> dict:
    """``{"size": bytes, "version": etag or modification time}`` of the object at ``url``."""
    fs = _filesystem(url, options)
    info = with_retries(lambda: fs.info(_fs_path(url)), url, "get the size of", options)
    if info.get("type") == "directory":
        raise IsADirectoryError(f"{url!r} is a directory, not a file")
    version = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified")
    out = {"size": int(info["size"]), "version": str(version)}
    _INFOS[url] = out
    return out


def known_info(url: str) -> Optional[dict]:
    """The ``object_info`` this process last read for ``url``, if any (no request)."""
    return _INFOS.get(url)


def object_size(url: str, options: RemoteOptions) -> int:
    """The size in bytes of the object at ``url``."""
    return object_info(url, options)["size"]


def read_range(url: str, start: int, end: int, options: RemoteOptions) -> bytes:
    """Bytes ``[start, end)`` of the object at ``url``, with retries."""
    return _read_range(url, start, end, options)


def _read_range(url: str, start: int, end: int, options: RemoteOptions) -> bytes:
    fs = _filesystem(url, options)

    def read() -> bytes:
        data = fs.cat_file(_fs_path(url), start=start, end=end)
        if len(data) != end - start:
            raise ConnectionError(f"short read: got {len(data)} of {end - start} bytes")
        return data

    return with_retries(read, url, f"read bytes {start}-{end}", options)


class RemoteFile(io.RawIOBase):
    """A read-only, seekable file over a remote object, read in ranged blocks.

    Blocks are read ahead in threads while the file is read in order; up to
    ``read_ahead + 2`` blocks are held. Not shared between threads.

    Args:
      url: the object, e.g. ``"s3://bucket/train-0.parquet"``.
      options: retries, block size and read-ahead.
      size: the object's size if known (saves a request).

    Example:
        with RemoteFile("s3://bucket/data.parquet", RemoteOptions()) as f:
            magic = f.read(4)
    """

    def __init__(self, url: str, options: RemoteOptions, size: Optional[int] = None):
        super().__init__()
        self._url = url
        self._options = options
        self._size = object_size(url, options) if size is None else size
        self._pos = 0
        self._blocks: OrderedDict[int, futures.Future] = OrderedDict()
        self._last_block = -2

    @property
    def name(self) -> str:
        return self._url

    @property
    def size(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError(f"RemoteFile.seek: whence must be 0, 1 or 2, got {whence}")
        if pos < 0:
            raise ValueError(f"RemoteFile.seek: negative position {pos} in {self._url!r}")
        self._pos = pos
        return pos

    def _submit(self, block: int) -> futures.Future:
        future = self._blocks.get(block)
        if future is None:
            start = block * self._options.block_size
            end = min(start + self._options.block_size, self._size)
            future = _pool().submit(_read_range, self._url, start, end, self._options)
            self._blocks[block] = future
        else:
            self._blocks.move_to_end(block)
        return future

    def _block(self, block: int) -> bytes:
        future = self._submit(block)
        last = (self._size - 1) // self._options.block_size
        if block == self._last_block + 1:
            # Reading in order: fetch the next blocks while this one is used.
            for ahead in range(block + 1, min(block + self._options.read_ahead, last) + 1):
                self._submit(ahead)
        self._last_block = block
        while len(self._blocks) > self._options.read_ahead + 2:
            _, old = self._blocks.popitem(last=False)
            old.cancel()
        try:
            return future.result()
        except BaseException:
            # A failed block is not kept: the next read of it tries again.
            self._blocks.pop(block, None)
            raise

    def readinto(self, buffer: Any) -> int:
        if self.closed:
            raise ValueError(f"I/O operation on closed RemoteFile {self._url!r}")
        view = memoryview(buffer).cast("B")
        want = min(len(view), max(self._size - self._pos, 0))
        done = 0
        bs = self._options.block_size
        while done < want:
            block, offset = divmod(self._pos + done, bs)
            data = self._block(block)
            n = min(len(data) - offset, want - done)
            view[done : done + n] = data[offset : offset + n]
            done += n
        self._pos += done
        return done

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = max(self._size - self._pos, 0)
        buffer = bytearray(min(size, max(self._size - self._pos, 0)))
        n = self.readinto(buffer)
        return bytes(buffer[:n])

    def readall(self) -> bytes:
        return self.read(-1)

    def close(self) -> None:
        for future in self._blocks.values():
            future.cancel()
        self._blocks.clear()
        super().close()


class LocalCache:
    """Whole copies of remote files in a local directory, bounded in bytes.

    A file is fetched by parallel ranged reads into a temporary name and renamed
    when complete, so processes sharing the directory never read a partial copy;
    the copy is named by a hash of the URL, size and modification time, so a
    changed object is fetched again. Beyond ``max_bytes`` the least recently used
    copies are removed, except those ``pinned`` now by any process sharing the
    directory (a reader that has one open keeps reading it after its removal).

    Args:
      directory: where the copies live; created if missing.
      options: retries and block size of the ranged reads.
      max_bytes: the bound; None for none.

    Example:
        cache = LocalCache("/tmp/shards", RemoteOptions(), max_bytes=10 << 30)
        local = cache.fetch("s3://bucket/train-00000-of-00008.array_record")
    """

    def __init__(self, directory: str, options: RemoteOptions, max_bytes: Optional[int] = None):
        self._dir = directory
        self._options = options
        self._max_bytes = max_bytes
        self._lock = threading.Lock()

    @property
    def directory(self) -> str:
        return self._dir

    def _name(self, url: str, info: dict) -> str:
        digest = hashlib.sha1(f"{url}\0{info['size']}\0{info['version']}".encode()).hexdigest()[:20]
        base = re.sub(r"[^A-Za-z0-9._-]", "_", url.rstrip("/").rsplit("/", 1)[-1])[-80:]
        return f"{digest}-{base}"

    def fetch(self, url: str, info: Optional[dict] = None) -> str:
        """Returns a local path holding the contents of ``url``, fetching it if needed.

        Args:
          url: the remote object.
          info: its ``object_info``, if known: a file already cached is then found
            without asking the store.
        """
        if info is None:
            info = object_info(url, self._options)
        size = info["size"]
        name = self._name(url, info)
        path = os.path.join(self._dir, name)
        if _touch(path):
            return path
        os.makedirs(self._dir, exist_ok=True)
        # One copy at a time per file, across the processes and threads sharing the
        # directory: the others wait here, then find it done.
        with open(self._lock_path(name), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if _touch(path):
                return path
            self._copy(url, size, path)
        self._evict(keep=path)
        return path

    @contextlib.contextmanager
    def pinned(self, url: str, info: Optional[dict] = None) -> Iterator[str]:
        """``fetch``, and the copy stays until the block ends: open it inside.

        Another thread or process sharing the directory may evict the copy
        between ``fetch`` returning and the caller opening it; a pinned copy is
        skipped by every eviction (a shared lock on its lock file).
        """
        for _ in range(_PIN_ATTEMPTS):
            path = self.fetch(url, info)
            with open(self._lock_path(os.path.basename(path)), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_SH)
                if _touch(path):
                    try:
                        yield path
                    finally:
                        lock.close()
                        # Copies kept over the bound while pinned go now (least
                        # recently used first; this one was just used).
                        self._evict(keep=path)
                    return
            # Evicted before the pin: fetched again.
        raise RemoteReadError(
            f"{url!r}: its local copy in {self._dir!r} was evicted {_PIN_ATTEMPTS} times before "
            "it could be opened; raise RemoteOptions.cache_max_bytes (it must hold the files "
            "read at the same time)"
        )

    def _lock_path(self, name: str) -> str:
        return os.path.join(self._dir, f".lock-{name}")

    def _copy(self, url: str, size: int, path: str) -> None:
        fd, tmp = tempfile.mkstemp(dir=self._dir, prefix=".partial-")
        try:
            bs = self._options.block_size
            ranges = [(s, min(s + bs, size)) for s in range(0, size, bs)]

            def copy(r: tuple[int, int]) -> None:
                os.pwrite(fd, _read_range(url, r[0], r[1], self._options), r[0])

            # Blocks of one file in parallel: remote latency, not bandwidth, bounds
            # a single ranged read.
            for f in [_pool("copy").submit(copy, r) for r in ranges]:
                f.result()
            os.close(fd)
            fd = -1
            os.replace(tmp, path)
        finally:
            if fd >= 0:
                os.close(fd)
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _evict(self, keep: str) -> None:
        if self._max_bytes is None:
            return
        with self._lock:
            entries = []
            for name in os.listdir(self._dir):
                if name.startswith((".partial-", ".lock-")):
                    continue
                full = os.path.join(self._dir, name)
                try:
                    st = os.stat(full)
                except OSError:
                    continue
                entries.append((st.st_mtime, st.st_size, full))
            total = sum(size for _, size, _ in entries)
            for _, size, full in sorted(entries):
                if total <= self._max_bytes:
                    break
                if full != keep and self._remove_unpinned(full):
                    total -= size

    def _remove_unpinned(self, path: str) -> bool:
        """Removes a cached copy unless it is pinned or being fetched (never waits)."""
        try:
            fd = os.open(self._lock_path(os.path.basename(path)), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(path)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)  # Releases the lock.


# Fetches of one file before its copy could be pinned, when other readers keep
# evicting it (a cache bound smaller than the files read at the same time).
_PIN_ATTEMPTS = 20


def _touch(path: str) -> bool:
    """Marks a cached copy recently used; False if it is gone."""
    try:
        os.utime(path)
        return True
    except OSError:
        return False



def default_cache_dir() -> str:
    """The cache directory used when ``RemoteOptions.cache_dir`` is None."""
    return os.path.join(tempfile.gettempdir(), f"grainlike-remote-cache-{os.getuid()}")


def cache_for(options: RemoteOptions) -> LocalCache:
    """The cache ``options`` describe (the default directory when it names none)."""
    return LocalCache(options.cache_dir or default_cache_dir(), options, options.cache_max_bytes)


@contextlib.contextmanager
def pinned_input(path: Any, options: Optional[RemoteOptions] = None) -> Iterator[Any]:
    """``open_input``, with a cached copy kept from eviction until the block ends.

    Open the file inside the block; the open file stays readable after it.
    """
    options = options or RemoteOptions()
    url = to_url(path)
    if is_remote(url) and options.cache_dir is not None:
        with cache_for(options).pinned(url) as local:
            yield local
    else:
        yield open_input(url, options)


def open_input(path: Any, options: Optional[RemoteOptions] = None) -> Any:
    """Opens ``path`` for reading: a local path, a cached local copy or a ``RemoteFile``.

    Returns a path string for local files and for remote ones when
    ``options.cache_dir`` is set, else a ``RemoteFile``.
    """
    options = options or RemoteOptions()
    url = to_url(path)
    if not is_remote(url):
        return local_path(url)
    if options.cache_dir is not None:
        return cache_for(options).fetch(url)
    return RemoteFile(url, options)
