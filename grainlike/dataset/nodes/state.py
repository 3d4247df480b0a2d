"""Validating the states given to ``set_state``, before anything changes.

Every ``set_state`` of grainlike's iterator stages first refuses a state nested
deeper than ``MAX_STATE_DEPTH`` (``guard_set_state``, applied to each stage class),
(``core.state_depth``), so a hostile state (a 100,000-deep JSON object) is an
``InvalidStateError``, never a ``RecursionError`` in whichever stage first prints,
copies or compares it.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np

from grainlike.core.errors import InvalidStateError, StateIndexError, StateKeyError, StateTypeError, is_int
from grainlike.core.state_depth import MAX_STATE_DEPTH, check_depth  # noqa: F401  (re-exported)


def guard_set_state(cls: type) -> None:
    """Makes ``cls.set_state`` refuse too deep a state before it runs.

    Wraps the ``set_state`` the class resolves to, unless it is wrapped already (a
    base's) or abstract: also one a mixin that is no iterator stage defines.
    """
    set_state = getattr(cls, "set_state", None)
    if (
        not callable(set_state)
        or getattr(set_state, "_checks_depth", False)
        or getattr(set_state, "__isabstractmethod__", False)
    ):
        return

    @functools.wraps(set_state)
    def checked(self: Any, state: Any, *args: Any, **kwargs: Any) -> Any:
        check_depth(state, self)
        return set_state(self, state, *args, **kwargs)

    checked._checks_depth = True  # type: ignore[attr-defined]
    setattr(cls, "set_state", checked)


def require_keys(state: Any, stage: Any, keys: Sequence[str]) -> dict:
    """Returns ``state`` after checking it is a dict holding ``keys``.

    Raises:
      StateTypeError: ``state`` is not a dict (a ``TypeError`` too, as grain).
      StateKeyError: a key is missing (a ``KeyError`` too).
    """
    if not isinstance(state, dict):
        raise StateTypeError(f"{stage}: a state must be a dict, got {state!r}")
    for key in keys:
        if key not in state:
            raise StateKeyError(f"{stage}: the state lacks {key!r}; got {state!r}")
    return state


# No position, count or index in a state is past int64: a larger one is garbage
# (and would overflow ``range`` or numpy further on).
STATE_INT_LIMIT = 2**63


def non_negative_int(state: dict, key: str, stage: Any, upper: Any = None) -> int:
    """``state[key]`` as an int in ``[0, upper]`` (``[0, 2**63)`` for None).

    Raises:
      StateTypeError: the value is not an int (a ``TypeError`` too, as grain).
      StateIndexError: the value is negative or exceeds ``upper`` (an ``IndexError``
        too, as grain).
    """
    value = state[key]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise StateTypeError(f"{stage}: state[{key!r}] must be a non-negative int, got {value!r}")
    if value < 0:
        raise StateIndexError(f"{stage}: state[{key!r}] must be a non-negative int, got {value}")
    if upper is not None and value > upper:
        raise StateIndexError(
            f"{stage}: state[{key!r}] = {value} is out of range for a dataset of length {upper}"
        )
    if value >= STATE_INT_LIMIT:
        raise StateIndexError(f"{stage}: state[{key!r}]: {value} is out of range [0, 2**63)")
    return int(value)


def state_list(state: dict, key: str, stage: Any, length: Any = None, why: str = "") -> list:
    """``state[key]`` after checking it is a list (or tuple) of ``length`` entries (``why``: whence).

    Raises:
      StateTypeError: the value is not a list, or not of ``length`` entries.
    """
    value = state[key]
    if not isinstance(value, (list, tuple)) or (length is not None and len(value) != length):
        size = "" if length is None else f" of {length} entries{why}"
        raise StateTypeError(f"{stage}: state[{key!r}] must be a list{size}, got {value!r}")
    return list(value)


# The keys of an interleave-shaped state (grain's interleave and mp_prefetch), in the
# order a missing one is named.
INTERLEAVE_STATE_KEYS = (
    "next_index_in_cycle",
    "next_index_in_datasets",
    "iterators_in_use_indices",
    "iterators_in_use_states",
    "exhausted",
)


def interleave_state(state: Any, stage: Any, slots: Any = None) -> dict:
    """Checks the types of an interleave-shaped state (interleave, mp_prefetch), not what they mean.

    The state has ``INTERLEAVE_STATE_KEYS``; the three per-slot lists have ``slots``
    entries (any number for None).

    Raises:
      StateTypeError / StateKeyError / StateIndexError (all ``InvalidStateError``).
    """
    require_keys(state, stage, INTERLEAVE_STATE_KEYS)
    non_negative_int(state, "next_index_in_cycle", stage)
    non_negative_int(state, "next_index_in_datasets", stage)
    indices = state_list(state, "iterators_in_use_indices", stage, slots)
    why = f" (one per entry of state['iterators_in_use_indices'] = {indices!r})"
    states = state_list(state, "iterators_in_use_states", stage, len(indices), why)
    exhausted = state_list(state, "exhausted", stage, len(indices), why)
    for index in indices:
        if not is_int(index) or not 0 <= index < STATE_INT_LIMIT:
            raise StateTypeError(
                f"{stage}: state['iterators_in_use_indices'] holds {index!r}, not an int in [0, 2**63)"
            )
    for entry in states:
        if entry is not None and not isinstance(entry, dict):
            raise StateTypeError(
                f"{stage}: state['iterators_in_use_states'] holds {entry!r}, not a dict or None"
            )
    for entry in exhausted:
        if isinstance(entry, float) or entry not in (0, 1):
            raise StateTypeError(f"{stage}: state['exhausted'] holds {entry!r}, not 0 or 1")
    if "future_states" in state and not isinstance(state["future_states"], dict):
        raise StateTypeError(
            f"{stage}: state['future_states'] must be a dict, got {state['future_states']!r}"
        )
    return state


def parent_states(state: dict, stage: Any, count: int) -> list:
    """``state["parents"]`` after checking it is a list of ``count`` states.

    Raises:
      StateTypeError: not a list. InvalidStateError: not ``count`` states.
    """
    states = state["parents"]
    if not isinstance(states, Sequence):
        raise StateTypeError(f"{stage}: state['parents'] must be a list of states, got {states!r}")
    if len(states) != count:
        raise InvalidStateError(f"{stage}: state['parents'] must hold {count} states, got {states!r}")
    return list(states)


def set_all_or_none(pairs: Sequence[tuple]) -> None:
    """``iterator.set_state(state)`` for each pair; if one refuses, puts every iterator back as it was."""
    before = [it.get_state() for it, _ in pairs]
    try:
        for it, s in pairs:
            it.set_state(s)
    except Exception:
        for (it, _), s in zip(pairs, before):
            it.set_state(s)
        raise
