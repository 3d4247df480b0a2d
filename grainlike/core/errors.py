"""Every exception and warning class grainlike defines, exception notes, and ``check_int``.

Each docstring says when the error is raised and which grain class it equals or
subclasses ("none in grain" where grain has none). The modules that raise them
re-export them under their old names (e.g. ``grainlike.sources.remote.RemoteReadError``).
"""

from __future__ import annotations

import linecache
import sys
import types
from typing import Any, Optional

import numpy as np


def add_note(error: BaseException, note: str) -> None:
    """Attaches ``note`` to ``error`` so it prints with the traceback (PEP 678)."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:  # Python 3.10: keep the note where 3.11's traceback would look.
        notes = list(getattr(error, "__notes__", []))
        notes.append(note)
        try:
            error.__notes__ = notes
        except AttributeError:
            pass


def is_int(value: Any) -> bool:
    """Whether ``value`` is an ``int`` or a numpy integer, and not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_int(what: str, value: Any, low: int = 0, high: Optional[int] = None, *,
              none_ok: bool = False, type_error: type = ValueError) -> Optional[int]:
    """``value`` as an ``int``, if it is one (numpy's too, bools not) in ``[low, high)``.

    Args:
      what: the argument's name, which the message begins with.
      value: what was passed.
      low: the least value accepted.
      high: the first value too large, if there is one.
      none_ok: whether None is accepted (and returned).
      type_error: the class raised for a value that is not an int.

    Raises:
      ValueError: out of range, or not an int where ``type_error`` is ValueError;
        e.g. ``batch_size must be a positive int, got 0``.
    """
    if value is None and none_ok:
        return None
    fits = is_int(value)
    if fits and value >= low and (high is None or value < high):
        return int(value)
    if high is not None:
        top = f"2**{high.bit_length() - 1}" if high > 1024 and not high & (high - 1) else high
        kind = f"an int in [{low}, {top})"
    else:
        kind = "a positive int" if low == 1 else f"an int >= {low}"
    raise (type_error if not fits else ValueError)(
        f"{what} must be {kind}{' or None' if none_ok else ''}, got {value!r}"
    )


# At most this many frames of another process's traceback are rebuilt (the innermost).
_MAX_REBUILT_FRAMES = 200


class _Rebuilt(Exception):
    """Raised by a rebuilt frame's one line of code to capture that frame; never reaches the user."""


def _stand_in(filename: str, lineno: int, name: str) -> types.FunctionType:
    """A function named ``name`` that raises ``_Rebuilt`` at ``filename:lineno``."""
    # The raise starts at the real line's indentation and spans two lines, so no
    # traceback display underlines part of the real line (whose columns it lacks).
    line = linecache.getline(filename, lineno)
    indent = len(line) - len(line.lstrip()) if line.strip() and lineno > 1 else 0
    if indent:
        source = "\n" * (lineno - 2) + "def _stand_in():\n" + " " * indent + "raise (\n_Rebuilt)"
    else:
        source = "\n" * (lineno - 1) + "def _stand_in(): raise (\n_Rebuilt)"
    module = compile(source, filename, "exec")
    body = next(c for c in module.co_consts if isinstance(c, types.CodeType))
    renamed = body.replace(co_name=name, **({"co_qualname": name} if hasattr(body, "co_qualname") else {}))
    namespace = {"_Rebuilt": _Rebuilt, "__name__": "grainlike.rebuilt_frame"}
    exec(module.replace(co_consts=tuple(renamed if c is body else c for c in module.co_consts)), namespace)
    return namespace["_stand_in"]


def traceback_from_frames(frames: list) -> Optional[types.TracebackType]:
    """A traceback whose entries are ``frames`` (``(filename, lineno, function name)``, outermost first).

    For an exception raised in another process: debuggers, ``traceback`` and pytest
    show those frames with their source lines (their locals are empty). None where
    ``frames`` is empty or cannot be rebuilt.
    """
    tb = None
    for filename, lineno, name in reversed(list(frames)[-_MAX_REBUILT_FRAMES:]):
        try:
            stand_in = _stand_in(str(filename), max(int(lineno), 1), str(name))
            stand_in()
        except _Rebuilt:
            entry = sys.exc_info()[2].tb_next  # The stand-in's frame, below this one.
            entry.tb_next = tb
            tb = entry
        except Exception:  # noqa: BLE001 - a frame that cannot be rebuilt is left out
            continue
    return tb


class InvalidStateError(ValueError):
    """A state passed to ``set_state`` does not fit the iterator; raised before anything changes.

    grain: a ``ValueError`` (for a state of another pipeline), which this class subclasses.
    """


class StateKeyError(InvalidStateError, KeyError):
    """A state lacks a key the iterator needs (a ``KeyError``, as grain raises)."""

    __str__ = BaseException.__str__


class StateIndexError(InvalidStateError, IndexError):
    """A state's position is out of range (an ``IndexError``, as grain raises)."""


class StateTypeError(InvalidStateError, TypeError):
    """A state, or a value in it, has the wrong type (a ``TypeError``, as grain raises)."""


class StateTooDeepError(StateKeyError, StateTypeError):
    """A state nested deeper than any iterator's; refused before any stage reads it.

    grain: a ``KeyError`` (a key missing at the top), a ``TypeError`` (nesting where
    a number belongs) or a ``RecursionError``; this class is the first two.
    """


class ClosedIteratorError(ValueError, RuntimeError):
    """An iterator was used after ``close()``; the message names the iterator.

    Raised by every closable iterator and read-ahead thread. grain: a ``ValueError``
    ("Trying to advance a closed iterator"), which this class subclasses; also a
    ``RuntimeError``, which grainlike's closed ``DataLoaderIterator``,
    ``DeviceIterator`` and ``InJitIterator`` raised before, so both handlers work.
    """


class NonSequentialSliceError(ValueError, AssertionError):
    """A source was asked for a non-sequential slice in place (``set_slice``).

    Sources slice themselves only into contiguous ranges; ``to_iter_dataset()``'s
    stage takes every ``n``-th element. An ``AssertionError`` too, as grain raises.
    """


class WorkersDropRemaindersWarning(UserWarning):
    """A pipeline's workers drop more elements than the same pipeline without them.

    Each ``mp_prefetch`` worker batches its own slice, so ``batch(...,
    drop_remainder=True)`` below it drops a partial batch per worker (as grain does,
    without a warning); batching after ``mp_prefetch`` drops only the last one.
    """


# -- core ---------------------------------------------------------------------------


class UnrecognizedOptionError(ValueError, AttributeError):
    """``grainlike.config`` was asked for, or updated with, an option name grain does not have.

    grain: a ``ValueError`` (``Unrecognized config option``); also an ``AttributeError``,
    so that ``hasattr``, ``getattr(config, name, default)`` and ``copy`` work.
    """


class EmptyShardError(ZeroDivisionError, ValueError):
    """This process's shard holds no records (more shards than records).

    grain: a ``ZeroDivisionError`` (its samplers divide by the shard's size); also a
    ``ValueError``, as the cause is a bad argument.
    """


class StructureError(ValueError):
    """Trees (records, batches, states) that should have the same structure differ (``core.tree``).

    grain: none in grain; a ``ValueError``.

    Attributes:
      path: where they differ, e.g. ``['image'][0]`` (empty at the root).
      detail: how they differ.
    """

    def __init__(self, path: str, detail: str):
        self.path = path
        self.detail = detail
        where = f" at {path}" if path else ""
        super().__init__(f"the structures differ{where}: {detail}")


class _LeafMismatch(Exception):
    """Leaves at one path do not stack; ``tree.stack`` turns it into a ValueError naming path and records."""

    def __init__(self, path: tuple, detail: str):
        self.path = path
        self.detail = detail


# -- worker processes ----------------------------------------------------------------


class WorkerError(RuntimeError):
    """A worker failed with an exception that could not be sent back as itself (its traceback is the message).

    grain: none in grain (grain re-raises what it can unpickle, else fails to).
    """


class WorkerDiedError(RuntimeError):
    """A worker process exited unexpectedly (killed, crashed, out of memory, ``sys.exit``).

    The message names the worker, its pid, how it ended and its last delivered
    state. grain: the ``RuntimeError`` "Worker process was terminated
    unexpectedly ..." of its multiprocess prefetch, whose words it begins with.
    """


class ForeignWorkersError(RuntimeError):
    """A forked child tried to use its parent's workers (grain: none; a child shares its queues silently)."""


class WorkerStalledError(RuntimeError):
    """A worker made no progress for ``stall_timeout_s`` while its output was awaited.

    The message names the worker, its pid, its last delivered state and its Python
    stack. grain: none in grain (grain waits for ever).
    """


class _WorkerFailed(Exception):
    """Carries a worker's error out of the pool's output loop when it ends only that worker."""

    def __init__(self, error: BaseException):
        super().__init__()
        self.error = error


class UnsafeSegmentError(PermissionError):
    """A named shared-memory segment is another user's, or writable by group or others: not read.

    grain: none in grain (it reads any segment it can open).
    """


class SharedMemoryFullError(OSError):
    """``/dev/shm`` has too little space for an ``InMemoryDataSource(name=...)``'s segment.

    Raised before the segment is created; the message says how much is needed and
    free. grain: none in grain; an ``OSError`` (ENOSPC).
    """


# -- sources ------------------------------------------------------------------------


class RecordKeyOutOfRangeError(IndexError, ValueError):
    """A record key outside ``[0, len(source))`` was read from an ArrayRecord source.

    grain: a ``ValueError`` (``ArrayRecordDataSource``'s); also an ``IndexError``, so iteration stops.
    """


class SourceFileNotFoundError(FileNotFoundError, RuntimeError):
    """A file an ArrayRecord source reads does not exist (its path is in the message).

    grain: a ``RuntimeError`` (``ArrayRecordDataSource``'s); also a ``FileNotFoundError``.
    """


class RemoteAccessError(PermissionError):
    """Credentials for a remote object (``s3://``, ``gs://``), named in the message, are missing or refused.

    grain: none in grain.
    """


class RemoteReadError(OSError):
    """A read of a remote object still failed after its retries; the message names the object.

    grain: none in grain.

    Attributes:
      url: the object.
      status: the last HTTP status the store answered, if any (e.g. 500).
      attempts: the tries made.
    """

    def __init__(self, message: str, url: str = "", status: Optional[int] = None, attempts: int = 0):
        super().__init__(message)
        self.url = url
        self.status = status
        self.attempts = attempts

    def __reduce__(self):
        return (type(self), (str(self), self.url, self.status, self.attempts))


class ObjectChangedError(RemoteReadError):
    """A remote object was overwritten after it was first opened (its ETag or generation changed).

    Reading on would mix two versions; ``url``, ``old`` and ``new`` (also in the
    message) name the object and both versions. grain: none in grain.
    """

    def __init__(self, url: str, old: str, new: str):
        super().__init__(
            f"{url!r} changed while it was being read: it was pinned at version {old} when "
            f"first opened and is now {new}. Objects must not be overwritten while a pipeline "
            "reads them (write new data under new names); build the source again to read the "
            "new version.",
            url,
            None,
            1,
        )
        self.old = old
        self.new = new

    def __reduce__(self):
        return (type(self), (self.url, self.old, self.new))


class UnsafeCacheDirError(PermissionError):
    """The local cache directory of remote files is a link, another user's, or open to others.

    grain: none in grain.
    """


class CacheFullError(OSError):
    """The disk of the local cache of remote files is full (ENOSPC); no partial copy is left. grain: none."""


class RecordFormatError(ValueError):
    """A record is not in grainlike's record format (``grainlike.formats``), or a value cannot be stored in it.

    grain: none in grain.
    """


class CorruptRecordError(ValueError):
    """A TFRecord file is truncated or a record's checksum does not match (file and offset in the message).

    grain: a ``ValueError`` (its TFRecord reader's for a truncated file).
    """


# -- dataset ------------------------------------------------------------------------


class _CountMismatch(ValueError, AssertionError):
    """Weights and datasets given to a mix differ in number (grain: an ``AssertionError``)."""
