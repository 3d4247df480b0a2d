"""Exceptions and exception notes shared by every layer."""

from __future__ import annotations


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
