"""Exceptions and exception notes shared by every layer."""

from __future__ import annotations

import sys
import types
from typing import Optional


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


# At most this many frames of another process's traceback are rebuilt (the innermost).
_MAX_REBUILT_FRAMES = 200


class _Rebuilt(Exception):
    """Raised by a rebuilt frame's one line of code, to capture that frame."""


def traceback_from_frames(frames: list) -> Optional[types.TracebackType]:
    """A traceback whose entries are ``frames`` (``(filename, lineno, function name)``, outermost first).

    For an exception that happened in another process: debuggers, ``traceback``
    and pytest then show the frames where it was raised, with their source
    lines (read from ``filename`` as for any frame). Each entry is a frame of a
    stand-in code object with that file, line and name; its locals are empty.
    None where ``frames`` is empty or cannot be rebuilt.
    """
    tb = None
    for filename, lineno, name in reversed(list(frames)[-_MAX_REBUILT_FRAMES:]):
        try:
            # The statement spans two lines so that tracebacks underline no part
            # of the real line (whose columns the stand-in does not have).
            code = compile("\n" * (max(int(lineno), 1) - 1) + "raise (\n_Rebuilt)", str(filename), "exec")
            code = code.replace(co_name=str(name))
            exec(code, {"_Rebuilt": _Rebuilt, "__name__": "grainlike.rebuilt_frame"})
        except _Rebuilt:
            entry = sys.exc_info()[2].tb_next  # The stand-in's frame, below this one.
            entry.tb_next = tb
            tb = entry
        except Exception:  # noqa: BLE001 - a frame that cannot be rebuilt is left out
            continue
    return tb


class InvalidStateError(ValueError):
    """A state passed to ``set_state`` does not fit the iterator it is set into.

    Raised before anything changes: the iterator keeps its previous state.
    """


class StateKeyError(InvalidStateError, KeyError):
    """A state lacks a key the iterator needs (a ``KeyError``, as grain raises)."""

    __str__ = BaseException.__str__


class StateIndexError(InvalidStateError, IndexError):
    """A state's position is out of range (an ``IndexError``, as grain raises)."""


class StateTypeError(InvalidStateError, TypeError):
    """A state, or a value in it, has the wrong type (a ``TypeError``, as grain raises)."""


class ClosedIteratorError(ValueError):
    """An iterator was used after ``close()`` (a ``ValueError``, as grain raises)."""


class NonSequentialSliceError(ValueError, AssertionError):
    """A source was asked for a non-sequential slice in place (``set_slice``).

    Sources slice themselves only into contiguous ranges
    (``sequential_slice=True``); every ``n``-th element is taken by the stage of
    ``to_iter_dataset()``. An ``AssertionError`` too, as grain raises.
    """


class WorkersDropRemaindersWarning(UserWarning):
    """A pipeline's workers drop more elements than the same pipeline without them.

    Each worker of ``mp_prefetch`` batches its own slice, so a
    ``batch(..., drop_remainder=True)`` below it drops a partial batch per worker
    (as grain does). Batching after ``mp_prefetch`` drops only the last one.
    """
