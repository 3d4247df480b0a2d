"""Remote files and the local cache: defined in ``grainlike.sources.formats.remote_files`` and ``file_cache``."""

from grainlike.sources.formats import remote_files as _remote_files
from grainlike.sources.formats.file_cache import LocalCache
from grainlike.sources.formats.remote_files import *  # noqa: F401,F403

__all__ = sorted([*_remote_files.__all__, "LocalCache"])
