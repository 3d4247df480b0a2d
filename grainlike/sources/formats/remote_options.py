"""Remote paths and how they are reached: ``RemoteOptions``, ``to_url``, ``is_remote``.

A path is remote when fsspec reads it (``s3://``, ``gs://``, ``memory://``, ...);
``file://`` URLs and plain paths are local.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

__all__ = ["RemoteOptions", "is_remote", "local_path", "to_url", "url_protocol"]

_LOCAL_PROTOCOLS = ("file", "local")


@dataclasses.dataclass(frozen=True)
class RemoteOptions:
    """How remote objects are reached, retried, read ahead and cached.

    Attributes:
      storage_options: keyword arguments of the fsspec filesystem, e.g.
        ``{"endpoint_url": "http://localhost:9000", "key": ..., "secret": ...}``
        for ``s3fs`` or ``{"token": "anon"}`` for ``gcsfs``. Credentials are
        otherwise found as the filesystem's package finds them (environment,
        ``~/.aws``, metadata server).
      attempts: tries per request before ``RemoteReadError`` (at least 1). A store
        that keeps answering HTTP 5xx, a reset connection or a timeout is tried this
        many times (the filesystem's own client may retry inside one try too).
      backoff_s: wait after the first failed try; doubled after each one.
      max_backoff_s: the longest wait between two tries.
      timeout_s: seconds one request may wait for the store to connect, or between
        two pieces of its answer, before that try fails (then it is retried). Given
        to ``s3fs`` as botocore's ``connect_timeout``/``read_timeout`` and to
        ``gcsfs`` as ``requests_timeout`` unless ``storage_options`` set them. For
        ``s3://`` grainlike's tries are the only ones (botocore's and s3fs's own
        retries are set to one try unless ``config_kwargs`` sets ``retries``), so a
        read ends after about ``attempts * timeout_s`` plus the backoff waits at the
        latest; it never hangs. (``gcsfs`` retries some failures inside one try.)
      block_size: bytes per ranged read.
      read_ahead: blocks fetched ahead, in threads, while a file is read in order.
      cache_dir: a local directory that keeps whole copies of remote files. ArrayRecord
        files always go through a cache (``default_cache_dir()`` when this is None);
        Parquet files do only when this is set. It is created mode 0700 if missing and
        refused (``UnsafeCacheDirError``) if it is a symlink, owned by another user
        or writable by group or others.
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
    timeout_s: float = 60.0
    block_size: int = 4 << 20
    read_ahead: int = 4
    cache_dir: Optional[str] = None
    cache_max_bytes: Optional[int] = None

    def __post_init__(self):
        checks = (("attempts", ">= 1", lambda v: v >= 1), ("timeout_s", "> 0", lambda v: v > 0),
                  ("block_size", ">= 1", lambda v: v >= 1), ("read_ahead", ">= 0", lambda v: v >= 0),
                  ("cache_max_bytes", ">= 0 or None", lambda v: v is None or v >= 0))
        for name, bound, ok in checks:
            if not ok(value := getattr(self, name)):
                raise ValueError(f"RemoteOptions.{name} must be {bound}, got {value}")

    def _key(self) -> str:
        return repr((sorted((self.storage_options or {}).items()), self.timeout_s))

    def _filesystem_options(self, protocol: str) -> dict:
        """``storage_options`` with ``timeout_s`` as the filesystem's request timeouts."""
        out = dict(self.storage_options or {})
        if protocol in ("s3", "s3a"):
            config = dict(out.get("config_kwargs") or {})
            config.setdefault("connect_timeout", self.timeout_s)
            config.setdefault("read_timeout", self.timeout_s)
            # One retry policy, grainlike's: botocore's own retries would multiply
            # ``attempts`` and the time a failing read takes.
            config.setdefault("retries", {"total_max_attempts": 1})
            out["config_kwargs"] = config
        elif protocol in ("gs", "gcs"):
            out.setdefault("requests_timeout", self.timeout_s)
        return out


def to_url(path: Any) -> str:
    """``path`` as a string: a ``str``, an ``os.PathLike`` or an etils ``epath.Path``."""
    if isinstance(path, str):
        return path
    if isinstance(path, os.PathLike):
        return os.fspath(path)
    raise TypeError(f"expected a path (str or os.PathLike), got {path!r} of type {type(path).__name__}")


def url_protocol(url: str) -> str:
    """The protocol of ``url`` in lower case (``"s3"``, ``"gs"``); ``"file"`` for a plain path."""
    return url.split("://", 1)[0].lower() if "://" in url else "file"


def is_remote(path: Any) -> bool:
    """Whether ``path`` names an object that fsspec reads (not a local file)."""
    return url_protocol(to_url(path)) not in _LOCAL_PROTOCOLS


def local_path(path: Any) -> str:
    """A local path or ``file://`` URL as a plain path."""
    url = to_url(path)
    return url.split("://", 1)[1] if "://" in url else url
