"""Positions a restored reading stage does not deliver again.

After an ``mp_prefetch`` state is restored on another number of workers
(``parallel.elastic.rebalance_worker_states``), each worker's state may carry
``SKIP_KEY``: positions above its next one that were delivered before the
restore. The reading stage (``SkippingReader``: ``to_iter_dataset()``'s, and the
DataLoader's) drops them and its state names those still ahead.
"""

from __future__ import annotations

import bisect
import sys
from typing import Any, Optional

# In a worker's state: its positions above its next one that were delivered
# before a restore on another worker count, not to compute again.
SKIP_KEY = "skip_positions"


def split_skip_state(state: Any, owner: Any) -> tuple[Any, Optional[list[int]]]:
    """``state`` without its ``SKIP_KEY``, and the sorted positions it names (None: no key).

    Raises:
      InvalidStateError: the skip list is not a list of ints (naming ``owner``).
    """
    if not isinstance(state, dict) or SKIP_KEY not in state:
        return state, None
    skip = state[SKIP_KEY]
    if not isinstance(skip, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in skip):
        from grainlike.core.errors import InvalidStateError

        raise InvalidStateError(f"{owner}: '{SKIP_KEY}' must be a list of ints, got {skip!r}")
    return {k: v for k, v in state.items() if k != SKIP_KEY}, sorted(set(skip))


def with_pending_skip(state: dict, skip: list[int], next_index: int) -> dict:
    """``state`` plus the positions of ``skip`` at or after ``next_index``, if any."""
    if skip and skip[-1] >= next_index:
        state = {**state, SKIP_KEY: skip[bisect.bisect_left(skip, next_index) :]}
    return state


def skipped_in(skip: list[int], start: int, stop: int) -> list[int]:
    """The positions of the sorted list ``skip`` in ``[start, stop)``."""
    if not skip or skip[-1] < start or skip[0] >= stop:
        return []
    return skip[bisect.bisect_left(skip, start) : bisect.bisect_left(skip, stop)]


class SkippingReader:
    """Mixed in before ``NextIndexState``: a reader that does not deliver the positions its state skips.

    After a restore on another worker count, a state may carry ``SKIP_KEY``:
    positions above ``next_index`` delivered before it. The reader drops them
    (``_skipped``) and its state names those still ahead, until it has passed
    them all. The list is kept whole: a rewind after an error (a state without
    the key) skips them again.
    """

    _skip: list = []  # Sorted.
    # The first position to skip at or after _next_index, for readers that look
    # before each element (0: to be looked up again).
    _next_skip = sys.maxsize

    def get_state(self) -> dict:
        return with_pending_skip({"next_index": self._next_index}, self._skip, self._next_index)

    def set_state(self, state: dict) -> None:
        """As ``NextIndexState``; a state without ``SKIP_KEY`` keeps the skip list.

        Raises:
          InvalidStateError: the skip list is not a list of ints.
        """
        state, skip = split_skip_state(state, self)
        old = self._skip
        if skip is not None:
            self._skip = skip
        try:
            super().set_state(state)
        except BaseException:
            self._skip = old
            raise
        self._next_skip = 0

    def _skipped(self, start: int, stop: int) -> list[int]:
        """The positions in ``[start, stop)`` not to deliver."""
        return skipped_in(self._skip, start, stop)

    def _skips(self, position: int) -> bool:
        """Whether not to deliver ``position`` (at or after ``_next_skip``); moves ``_next_skip`` past it."""
        skip = self._skip
        at = bisect.bisect_left(skip, position)
        hit = at < len(skip) and skip[at] == position
        at += hit
        self._next_skip = skip[at] if at < len(skip) else sys.maxsize
        return hit
