"""Whether reading a source waits: what decides its read threads when no ``ReadOptions`` is given.

grain reads every source in 16 threads, which a source whose reads wait (remote
storage, a service) needs, and a source in memory or on a local disk does not: its
batched reads are fastest in the calling thread. Decided from the source's type and
declaration (``DeclaresWaiting``), never from a timing:

* a declared ``waits`` (a bool): as declared (grainlike's file sources wait when a
  file is remote; ``RangeDataSource``, ``InMemoryDataSource`` and
  ``HuggingFaceDataSource`` never wait);
* ``list``, ``tuple``, ``range`` and numpy arrays never wait;
* a source of ``tfds.data_source(...)`` waits when its data directory is remote;
* anything else (a source of the user's own type) waits, as grain assumes.

Example:
    >>> from grainlike.sources import RangeDataSource
    >>> source_waits(RangeDataSource(0, 4, 1)), source_waits([1, 2])
    (False, False)
    >>> class Fetched:
    ...     def __len__(self):
    ...         return 3
    ...     def __getitem__(self, key):
    ...         return key
    >>> source_waits(Fetched())
    True
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from grainlike.sources.protocol import DeclaresWaiting

__all__ = ["declared_waits", "source_waits"]

_MEMORY_TYPES = (list, tuple, range, np.ndarray)


def declared_waits(obj: Any) -> Optional[bool]:
    """What ``obj`` (a source, a transform, a function) declares as ``waits``; None if nothing.

    Raises:
      TypeError: ``obj.waits`` is not a bool.
    """
    if not isinstance(obj, DeclaresWaiting):
        return None
    value = obj.waits
    if not isinstance(value, (bool, np.bool_)):
        name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
        raise TypeError(
            f"{name}.waits must be True (its work per record waits: read or mapped in "
            f"threads by default) or False (local and CPU-bound: in the calling "
            f"thread), got {value!r}"
        )
    return bool(value)


def source_waits(source: Any) -> bool:
    """Whether reading ``source`` waits (see the module docstring)."""
    if isinstance(source, _MEMORY_TYPES):
        return False
    declared = declared_waits(source)
    if declared is not None:
        return declared
    from grainlike.sources import tfds
    from grainlike.sources.formats import remote_files as remote

    if tfds.is_tfds_source(source):
        data_dir = getattr(source.dataset_info, "data_dir", None)
        return data_dir is not None and remote.is_remote(data_dir)
    return True
