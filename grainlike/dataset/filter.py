"""Filter stages: a MapDataset marks removed elements None; an iterator skips them."""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any, Callable, Optional

from grainlike.core.transforms import FilterTransform
from grainlike.dataset.base import DatasetIterator
from grainlike.dataset.map import (
    ElementwiseMapDataset,
    PassThroughStateIterator,
    TransformIterDataset,
    note_iterator,
)


class FilterMapDataset(ElementwiseMapDataset):
    """``ds[i]`` is the parent's element if ``fn`` keeps it, else None."""

    _accepts = FilterTransform
    _method = "filter"

    def _apply(self, index: int, element: Any) -> Any:
        return element if self._fn(element) else None


_logger = logging.getLogger("grainlike")
# Filtered shares are checked over windows of this many elements.
WINDOW = 1000
# At most one warning per checker in this many seconds.
_WARN_EVERY_S = 60.0


class FilterThresholdChecker:
    """Warns or raises when a stage drops too large a share of its elements.

    Counts over consecutive windows of 1000 elements (grain's rule); thresholds
    come from ``DatasetOptions``.
    """

    def __init__(self, stage: Any, warn_threshold: Optional[float], raise_threshold: Optional[float]):
        # A proxy: the stage holds its checker, which must not keep the stage alive.
        self._stage = weakref.proxy(stage)
        self._warn = warn_threshold or float("inf")
        self._raise = raise_threshold or float("inf")
        self.seen = 0
        self.dropped = 0
        self._last_warning = -_WARN_EVERY_S

    @classmethod
    def for_iterator(cls, it: DatasetIterator) -> Optional["FilterThresholdChecker"]:
        """The checker the iterator's options ask for; None when both are off."""
        options = it._ctx.dataset_options
        warn, raise_ = options.filter_warn_threshold_ratio, options.filter_raise_threshold_ratio
        return cls(it, warn, raise_) if (warn or raise_) else None

    def check(self, passed: bool) -> None:
        self.seen += 1
        if not passed:
            self.dropped += 1
        if self.seen >= WINDOW:
            seen, dropped = self.seen, self.dropped
            self.seen = self.dropped = 0
            self.end_window(seen, dropped)

    def end_window(self, seen: int, dropped: int) -> None:
        """Raises or warns if ``dropped`` of the window's ``seen`` elements is too many."""
        ratio = dropped / seen
        if ratio >= self._raise:
            raise ValueError(
                f"Transformation {self._stage} skipped {ratio * 100:.2f} % of the last seen "
                f"{seen} elements. Please check the filtering logic. If this is intended, "
                "consider pre-filtering the input dataset before training. To disable this "
                "check, set `DatasetOptions.filter_raise_threshold_ratio` used in "
                "`WithOptionsIterDataset` to `None`."
            )
        now = time.monotonic()
        if ratio >= self._warn and now - self._last_warning >= _WARN_EVERY_S:
            self._last_warning = now
            _logger.warning(
                "Transformation %s skipped %.2f %% of the last seen %d elements. Please check "
                "the filtering logic. To disable this check, set "
                "`DatasetOptions.filter_warn_threshold_ratio` used in `WithOptionsIterDataset` "
                "to `None`.",
                str(self._stage),  # Formatted now: a log record may be formatted after the stage is gone.
                ratio * 100,
                seen,
            )


class _FilterDatasetIterator(PassThroughStateIterator):
    def __init__(self, parent: DatasetIterator, fn: Callable, name: str):
        super().__init__(parent)
        self._fn = fn
        self._name = name
        self._checker: Any = False  # Built on first use, once the options are final.

    def __next__(self):
        parent, fn = self._parent, self._fn
        checker = self._checker
        if checker is False:
            checker = self._checker = FilterThresholdChecker.for_iterator(self)
        while True:
            element = next(parent)
            try:
                passed = fn(element)
            except Exception as e:
                note_iterator(e, self, parent)
                raise
            if checker is not None:
                checker.check(passed)
            if passed:
                return element

    def __str__(self) -> str:
        return f"FilterDatasetIterator(transform={self._name})"


class FilterIterDataset(TransformIterDataset):
    """Keeps the elements of an IterDataset for which ``fn`` is true."""

    _accepts = FilterTransform
    _method = "filter"

    def __iter__(self) -> DatasetIterator:
        return _FilterDatasetIterator(self._parent.__iter__(), self._fn, self._name)
