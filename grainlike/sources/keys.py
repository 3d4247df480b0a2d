"""The record keys of a batched read: checked once, grouped by what holds them (a file, a row group).

Keys come in any order, repeated or not, as any sequence of integers; no Python loop per key.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Callable, SupportsIndex

import numpy as np

__all__ = ["check_keys", "group_by"]


def check_keys(
    record_keys: Sequence[SupportsIndex], length: int, out_of_range: Callable[[int], Exception]
) -> np.ndarray:
    """``record_keys`` as a 1-d ``int64`` array, each in ``[0, length)``.

    Args:
      record_keys: integers (a list, a range, a numpy array, numpy scalars).
      length: the source's length.
      out_of_range: builds the error for the first key outside the range.

    Raises:
      TypeError: a key is not an integer.
      Exception: ``out_of_range(key)`` for the first key out of range.

    Example:
      >>> check_keys([3, 0, 3], 5, IndexError).tolist()
      [3, 0, 3]
    """
    keys = np.asarray(record_keys)
    if keys.size == 0:
        return np.zeros(0, np.int64)
    if keys.dtype.kind not in "iu" or keys.ndim != 1:
        keys = np.array([operator.index(k) for k in record_keys], dtype=np.int64)
    keys = keys.astype(np.int64, copy=False)
    bad = (keys < 0) | (keys >= length)
    if bad.any():
        raise out_of_range(int(keys[np.argmax(bad)]))
    return keys


def group_by(groups: np.ndarray) -> list[np.ndarray]:
    """Positions of equal values of ``groups``, one array per value, values ascending.

    Positions keep their order within a group, so records of one file are read in
    the order they were asked for.

    Example:
      >>> [g.tolist() for g in group_by(np.array([1, 0, 1, 0]))]
      [[1, 3], [0, 2]]
    """
    order = np.argsort(groups, kind="stable")
    cuts = np.flatnonzero(np.diff(groups[order])) + 1
    return np.split(order, cuts)
