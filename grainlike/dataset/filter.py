"""Filter stages: a MapDataset marks removed elements None; an iterator skips them."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

from grainlike.core.transforms import FilterTransform, get_pretty_transform_name
from grainlike.dataset.iterator import DatasetIterator
from grainlike.dataset.map import (
    ElementwiseMapDataset,
    PassThroughStateIterator,
    TransformIterDataset,
    note_iterator,
)


def filter_name(transform: Any) -> str:
    """The filter as grain's ``str`` of a filter stage names it: a ``FilterTransform`` by its class."""
    if isinstance(transform, FilterTransform):
        return type(transform).__name__
    return get_pretty_transform_name(transform)


class FilterMapDataset(ElementwiseMapDataset):
    """``ds[i]`` is the parent's element if ``fn`` keeps it, else None."""

    _accepts = FilterTransform
    _method = "filter"

    def __str__(self) -> str:
        return f"FilterMapDataset(transform={filter_name(self._transform)})"

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

    Args:
      transform_name: the stage as the message names it (grain's text, e.g.
        ``FilterDatasetIterator(transform=KeepEven)``).
      warn_threshold: log a warning when a window drops at least this share;
        ``None`` or 0: never.
      raise_threshold: raise ``ValueError`` when a window drops at least this
        share; ``None`` or 0: never.
      where: grainlike only: the user's transform with the file and line it was
        defined at, said after grain's sentence.

    Example:
      >>> checker = FilterThresholdChecker("KeepNone", None, 0.5)
      >>> for _ in range(WINDOW - 1):
      ...     checker.check(False)
      >>> checker.check(False)
      Traceback (most recent call last):
      ...
      ValueError: Transformation KeepNone skipped 100.00 % of the last seen 1000 elements. ...
    """

    def __init__(
        self,
        transform_name: str,
        warn_threshold: Optional[float],
        raise_threshold: Optional[float],
        *,
        where: Optional[str] = None,
    ):
        self._transform_name = str(transform_name)
        self._where = f" The transform is {where}." if where else ""
        self._warn = warn_threshold or float("inf")
        self._raise = raise_threshold or float("inf")
        self.seen = 0
        self.dropped = 0
        self._last_warning = -_WARN_EVERY_S

    @classmethod
    def for_iterator(
        cls, it: DatasetIterator, transform_name: Optional[str] = None, where: Optional[str] = None
    ) -> Optional["FilterThresholdChecker"]:
        """The checker the iterator's options ask for (naming ``str(it)`` by default); None if both are off."""
        options = it._ctx.dataset_options
        warn, raise_ = options.filter_warn_threshold_ratio, options.filter_raise_threshold_ratio
        if not (warn or raise_):
            return None
        return cls(str(it) if transform_name is None else transform_name, warn, raise_, where=where)

    def check(self, passed: bool) -> None:
        """Counts one element, kept (``passed``) or dropped; checks each full window."""
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
                f"Transformation {self._transform_name} skipped {ratio * 100:.2f} % of the last seen "
                f"{seen} elements.{self._where} Please check the filtering logic. If this is intended, "
                "consider pre-filtering the input dataset before training. To disable this "
                "check, set `DatasetOptions.filter_raise_threshold_ratio` used in "
                "`WithOptionsIterDataset` to `None`."
            )
        now = time.monotonic()
        if ratio >= self._warn and now - self._last_warning >= _WARN_EVERY_S:
            self._last_warning = now
            _logger.warning(
                "Transformation %s skipped %.2f %% of the last seen %d elements.%s Please check "
                "the filtering logic. To disable this check, set "
                "`DatasetOptions.filter_warn_threshold_ratio` used in `WithOptionsIterDataset` "
                "to `None`.",
                self._transform_name,
                ratio * 100,
                seen,
                self._where,
            )


class _FilterDatasetIterator(PassThroughStateIterator):
    def __init__(self, parent: DatasetIterator, fn: Callable, name: str, pretty_name: str):
        super().__init__(parent)
        self._fn = fn
        self._name = name
        self._pretty_name = pretty_name
        self._checker: Any = False  # Built on first use, once the options are final.

    def __next__(self):
        parent, fn = self._parent, self._fn
        checker = self._checker
        if checker is False:
            checker = self._checker = FilterThresholdChecker.for_iterator(
                self, f"FilterDatasetIterator(transform={self._pretty_name})", where=self._name
            )
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
        return f"FilterDatasetIterator(transform={self._pretty_name})"

    def describe(self) -> str:
        return f"FilterDatasetIterator(transform={self._name})"


class FilterIterDataset(TransformIterDataset):
    """Keeps the elements of an IterDataset for which ``fn`` is true."""

    _accepts = FilterTransform
    _method = "filter"

    def __iter__(self) -> DatasetIterator:
        return _FilterDatasetIterator(self._parent.__iter__(), self._fn, self._name, filter_name(self._transform))

    def __str__(self) -> str:
        return f"FilterIterDataset(transform={filter_name(self._transform)})"
