"""Remote files and the local cache: defined in ``grainlike.sources.formats.remote_files`` and ``file_cache``."""

from grainlike.sources.formats.remote_files import (
    CacheFullError,
    ObjectChangedError,
    RemoteAccessError,
    RemoteFile,
    RemoteOptions,
    RemoteReadError,
    UnsafeCacheDirError,
    is_remote,
    open_input,
    pinned_input,
    to_url,
    with_retries,
)
from grainlike.sources.formats.file_cache import LocalCache

__all__ = [
    "CacheFullError",
    "LocalCache",
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
