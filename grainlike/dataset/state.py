"""Validating the states given to ``set_state``, before anything changes."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from grainlike.core.errors import StateIndexError, StateKeyError, StateTypeError


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


def non_negative_int(state: dict, key: str, stage: Any, upper: Any = None) -> int:
    """``state[key]`` as an int in ``[0, upper]`` (no upper bound for None).

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
    return int(value)
