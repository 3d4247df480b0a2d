"""Remote files and the local cache: defined in ``grainlike.sources.formats.remote_files``."""

from grainlike.sources.formats.remote_files import (
    CacheFullError,
    LocalCache,
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
