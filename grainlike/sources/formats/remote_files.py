"""Remote files for the file sources: ``s3://``, ``gs://``, ``file://`` through fsspec.

A source reads a remote object as a ``RemoteFile`` (read in ranged blocks, the next
ones fetched ahead in threads) or as a whole local copy (``file_cache.LocalCache``).
Each object is pinned to the version (ETag, S3 VersionId, GCS generation) seen when
it is first opened, and every ranged read asks for that version and checks the one
that answered, so an object overwritten while it is read raises ``ObjectChangedError``
instead of mixing two versions. ``fsspec`` and the filesystem's package are imported
only when a remote path is read: ``pip install "grainlike[remote]"``.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections import OrderedDict
from concurrent import futures
from typing import Any, Callable, Iterator, Optional

from grainlike.core.errors import (
    CacheFullError,
    ObjectChangedError,
    RemoteAccessError,
    RemoteReadError,
    UnsafeCacheDirError,
)
from grainlike.sources.formats.remote_options import RemoteOptions, is_remote, local_path, to_url, url_protocol
from grainlike.sources.formats.remote_pins import check_pin
from grainlike.sources.formats.remote_retries import error_names, http_status, with_retries

__all__ = [
    "CacheFullError",
    "ObjectChangedError",
    "RemoteAccessError",
    "RemoteFile",
    "RemoteOptions",
    "RemoteReadError",
    "UnsafeCacheDirError",
    "is_remote",
    "open_input",
    "pinned_input",
    "to_url",
    "with_retries",
]

# Filesystems and thread pools of this process, made on first use; a forked child
# makes its own (it must not share the parent's connections, and inherited pools
# have no threads behind them).
_PER_PROCESS: dict = {}
_PER_PROCESS_LOCK = threading.Lock()
_PER_PROCESS_PID = os.getpid()
_POOL_THREADS = 16


def _per_process(key: tuple, make: Callable[[], Any]) -> Any:
    global _PER_PROCESS_PID
    with _PER_PROCESS_LOCK:
        if _PER_PROCESS_PID != os.getpid():
            _PER_PROCESS.clear()
            _PER_PROCESS_PID = os.getpid()
        value = _PER_PROCESS.get(key)
        if value is None:
            value = _PER_PROCESS[key] = make()
        return value


def _filesystem(url: str, options: RemoteOptions) -> Any:
    protocol = url_protocol(url)

    def make() -> Any:
        try:
            import fsspec  # pylint: disable=g-import-not-at-top
        except ImportError as e:
            raise ImportError(
                f"reading {url!r} needs fsspec and its filesystem for {protocol!r}: "
                'pip install "grainlike[remote]" (s3fs for s3://, gcsfs for gs://)'
            ) from e
        try:
            fs = fsspec.filesystem(protocol, **options._filesystem_options(protocol))
        except ImportError as e:
            raise ImportError(f"reading {url!r}: {e}") from e
        if protocol in ("s3", "s3a") and hasattr(fs, "retries"):
            # s3fs retries timeouts and resets inside one request (5 times by
            # default), which would multiply ``attempts`` too.
            fs.retries = 1
        return fs

    return _per_process(("filesystem", protocol, options._key()), make)


def _fs_path(url: str) -> str:
    return url.split("://", 1)[1] if "://" in url else url


def _pool(kind: str = "read") -> futures.ThreadPoolExecutor:
    """The process's threads of one kind: ``"read"`` (block reads, fetches ahead) or ``"copy"``.

    A fetch on a "read" thread waits for its copy's ranged reads: they run on other threads.
    """
    return _per_process(
        ("pool", kind), lambda: futures.ThreadPoolExecutor(_POOL_THREADS, thread_name_prefix=f"grainlike-remote-{kind}")
    )


def submit(fn: Callable[..., Any], *args: Any) -> futures.Future:
    """Runs ``fn(*args)`` on the process's read-ahead threads (fetches ahead of need)."""
    return _pool().submit(fn, *args)


# What this process last learnt of each object: url -> object_info.
_INFOS: dict = {}


def object_info(url: str, options: RemoteOptions) -> dict:
    """What identifies the object's current contents.

    Returns:
      ``{"size": bytes, "version": str, "etag": str or None, "version_id": S3
      VersionId or None, "generation": GCS generation or None, "md5": GCS's
      MD5 of the contents or None}``; ``version`` is the generation, else the
      ETag, else the modification time.
    """
    fs = _filesystem(url, options)
    info = with_retries(lambda: fs.info(_fs_path(url)), url, "get the size of", options)
    if info.get("type") == "directory":
        raise IsADirectoryError(f"{url!r} is a directory, not a file")
    etag = info.get("ETag") or info.get("etag")
    generation = info.get("generation")
    version = generation or etag or info.get("mtime") or info.get("LastModified")
    out = {
        "size": int(info["size"]),
        "version": str(version),
        "etag": None if etag is None else str(etag),
        "version_id": info.get("VersionId") or None,
        "generation": None if generation is None else str(generation),
        "md5": info.get("md5Hash") or None,
    }
    _INFOS[url] = out
    return out


def known_info(url: str) -> Optional[dict]:
    """The ``object_info`` this process last read for ``url``, if any (no request)."""
    return _INFOS.get(url)


async def _s3_get(fs: Any, bucket: str, key: str, request: dict) -> tuple:
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key, **request)  # pylint: disable=protected-access
    try:
        return response.get("ETag"), await response["Body"].read()
    finally:
        response["Body"].close()


def _pinned_s3_range(fs: Any, url: str, start: int, end: int, pin: dict) -> bytes:
    """A ranged GET sent with ``If-Match`` (and the VersionId when the bucket has them)."""
    import fsspec.asyn  # pylint: disable=g-import-not-at-top

    bucket, key, _ = fs.split_path(_fs_path(url))
    request = {"Range": f"bytes={start}-{end - 1}", "IfMatch": pin["etag"]}
    if pin.get("version_id"):
        request["VersionId"] = pin["version_id"]
    try:
        etag, data = fsspec.asyn.sync(fs.loop, _s3_get, fs, bucket, key, request)
    except Exception as e:  # pylint: disable=broad-except
        if http_status(e) == 412 or "PreconditionFailed" in f"{error_names(e)} {e}":
            try:
                now = _current_version(fs, url)
            except Exception as ask:  # pylint: disable=broad-except
                now = f"unknown ({type(ask).__name__}: {ask})"  # The 412 alone says it changed.
            raise ObjectChangedError(url, pin["etag"], now) from e
        raise
    # A store that ignores If-Match still says which version answered.
    if etag is not None and etag != pin["etag"]:
        raise ObjectChangedError(url, pin["etag"], etag)
    return data


def _pinned_gcs_range(fs: Any, url: str, start: int, end: int, pin: dict) -> bytes:
    """A ranged GET of the pinned generation, checked against the generation that answered.

    GCS names the generation it served in ``x-goog-generation``; where the answer
    does not (some emulators ignore ``generation=`` too), the object's generation
    is asked after the read: generations only grow, so an unchanged one then
    means these bytes are the pinned version's.
    """
    import fsspec.asyn  # pylint: disable=g-import-not-at-top

    target = fs.url(_fs_path(url), generation=pin["generation"])
    try:
        headers, data = fsspec.asyn.sync(
            fs.loop, fs._call, "GET", target, headers={"Range": f"bytes={start}-{end - 1}"}  # pylint: disable=protected-access
        )
    except FileNotFoundError as e:
        now = _current_version(fs, url)
        if now != pin["generation"]:
            raise ObjectChangedError(url, f"generation {pin['generation']}", f"generation {now}") from e
        raise
    answered = {k.lower(): v for k, v in (headers or {}).items()}.get("x-goog-generation")
    if answered is None:
        answered = _current_version(fs, url)
    if str(answered) != pin["generation"]:
        raise ObjectChangedError(url, f"generation {pin['generation']}", f"generation {answered}")
    return data


def _current_version(fs: Any, url: str) -> str:
    """The object's version now, asked afresh ("deleted" if it is gone); other failures raise."""
    try:
        fs.invalidate_cache(_fs_path(url))
        info = fs.info(_fs_path(url))
    except FileNotFoundError:
        return "deleted"
    return str(info.get("generation") or info.get("ETag") or info.get("etag") or info.get("mtime"))


def read_range(url: str, start: int, end: int, options: RemoteOptions, pin: Optional[dict] = None) -> bytes:
    """Bytes ``[start, end)`` of the object at ``url``, with retries.

    With ``pin`` (an ``object_info``), only that version's bytes are returned: a
    changed object raises ``ObjectChangedError``.
    """
    fs = _filesystem(url, options)
    protocol = url_protocol(url)

    def read() -> bytes:
        if pin is not None and pin.get("etag") and protocol in ("s3", "s3a") and hasattr(fs, "_call_s3"):
            data = _pinned_s3_range(fs, url, start, end, pin)
        elif pin is not None and pin.get("generation") and protocol in ("gs", "gcs") and hasattr(fs, "_call"):
            data = _pinned_gcs_range(fs, url, start, end, pin)
        else:
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
      size: the object's size if known (saves a request when ``pin`` is given too).
      pin: the ``object_info`` of the version to read (as it was when first
        opened); by default the current one. Reads of another version raise
        ``ObjectChangedError``.

    Example:
        with RemoteFile("s3://bucket/data.parquet", RemoteOptions()) as f:
            magic = f.read(4)
    """

    def __init__(
        self, url: str, options: RemoteOptions, size: Optional[int] = None, pin: Optional[dict] = None
    ):
        super().__init__()
        self._url = url
        self._options = options
        if pin is None or size is None:
            info = object_info(url, options)
            if pin is not None:
                check_pin(url, pin, info)
            pin = pin or info
        # Every block is read from this version of the object: a change raises
        # ObjectChangedError instead of mixing two versions.
        self._pin = pin
        self._size = pin["size"] if size is None else size
        self._pos = 0
        self._blocks: OrderedDict[int, futures.Future] = OrderedDict()
        self._last_block = -2

    @property
    def name(self) -> str:
        return self._url

    @property
    def size(self) -> int:
        return self._size

    @property
    def pin(self) -> dict:
        """The ``object_info`` of the version this file reads."""
        return self._pin

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}.get(whence)
        if base is None:
            raise ValueError(f"RemoteFile.seek: whence must be 0, 1 or 2, got {whence}")
        pos = base + offset
        if pos < 0:
            raise ValueError(f"RemoteFile.seek: negative position {pos} in {self._url!r}")
        self._pos = pos
        return pos

    def _submit(self, block: int) -> futures.Future:
        future = self._blocks.get(block)
        if future is None:
            start = block * self._options.block_size
            end = min(start + self._options.block_size, self._size)
            future = _pool().submit(read_range, self._url, start, end, self._options, self._pin)
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
        left = max(self._size - self._pos, 0)
        buffer = bytearray(left if size is None or size < 0 else min(size, left))
        return bytes(buffer[: self.readinto(buffer)])

    def close(self) -> None:
        for future in self._blocks.values():
            future.cancel()
        self._blocks.clear()
        super().close()


@contextlib.contextmanager
def pinned_input(
    path: Any, options: Optional[RemoteOptions] = None, pin: Optional[dict] = None
) -> Iterator[Any]:
    """``open_input``, with a cached copy kept from eviction until the block ends.

    Open the file inside the block; the open file stays readable after it.
    """
    options = options or RemoteOptions()
    url = to_url(path)
    if is_remote(url) and options.cache_dir is not None:
        from grainlike.sources.formats.file_cache import cache_for  # It builds on this module.

        with cache_for(options).pinned(url, pin) as local:
            yield local
    else:
        yield open_input(url, options, pin)


def open_input(path: Any, options: Optional[RemoteOptions] = None, pin: Optional[dict] = None) -> Any:
    """Opens ``path`` for reading: a local path, a cached local copy or a ``RemoteFile``.

    Returns a path string for local files and for remote ones when
    ``options.cache_dir`` is set, else a ``RemoteFile``. A remote object is read
    at the version ``pin`` (an ``object_info``) names, by default its current one;
    a change raises ``ObjectChangedError``.
    """
    options = options or RemoteOptions()
    url = to_url(path)
    if not is_remote(url):
        return local_path(url)
    if options.cache_dir is not None:
        from grainlike.sources.formats.file_cache import cache_for  # It builds on this module.

        return cache_for(options).fetch(url, pin)
    return RemoteFile(url, options, None if pin is None else pin["size"], pin)
