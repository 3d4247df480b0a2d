"""Filter stages: a MapDataset marks removed elements None; an iterator skips them."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional, Union

from grainlike.core.transforms import FilterTransform, get_pretty_transform_name
from grainlike.core.protocols import TakesChunks
from grainlike.dataset.nodes.element_spec import parent_element_spec
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.transformations.chunk import Chunk, ColumnFunction
from grainlike.dataset.transformations.map import (
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

    _element_spec = parent_element_spec

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
        defined at, said after grain's sentence (or a function returning it,
        called only for a message).

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
        where: Union[str, Callable[[], str], None] = None,
    ):
        self._transform_name = str(transform_name)
        self._where = where
        self._warn = warn_threshold or float("inf")
        self._raise = raise_threshold or float("inf")
        self.seen = 0
        self.dropped = 0
        self._last_warning = -_WARN_EVERY_S

    @classmethod
    def for_iterator(
        cls, it: DatasetIterator, transform_name: Optional[str] = None, where: Union[str, Callable[[], str], None] = None
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

    def check_all(self, verdicts: list) -> None:
        """``check`` for each of ``verdicts`` in turn; where one raises, ``failed_at`` is its index."""
        i = 0
        while i < len(verdicts):
            part = verdicts[i : i + WINDOW - self.seen]
            i += len(part)
            self.seen += len(part)
            self.dropped += len(part) - sum(map(bool, part))
            if self.seen >= WINDOW:
                seen, dropped = self.seen, self.dropped
                self.seen = self.dropped = 0
                self.failed_at = i - 1
                self.end_window(seen, dropped)

    def end_window(self, seen: int, dropped: int) -> None:
        """Raises or warns if ``dropped`` of the window's ``seen`` elements is too many."""
        ratio = dropped / seen
        if ratio < self._raise and ratio < self._warn:
            return
        where = self._where() if callable(self._where) else self._where
        where = f" The transform is {where}." if where else ""
        if ratio >= self._raise:
            raise ValueError(
                f"Transformation {self._transform_name} skipped {ratio * 100:.2f} % of the last seen "
                f"{seen} elements.{where} Please check the filtering logic. If this is intended, "
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
                where,
            )


class _FilterDatasetIterator(PassThroughStateIterator):
    def __init__(self, parent: DatasetIterator, stage: "FilterIterDataset"):
        super().__init__(parent)
        self._stage = stage
        self._fn = stage._fn
        # A function of elements with metadata that works on columns notes its own errors.
        self._columns = stage._fn if isinstance(stage._fn, ColumnFunction) else None
        self._checker: Any = False  # Built on first use, once the options are final.

    def _threshold_checker(self) -> Optional[FilterThresholdChecker]:
        if self._checker is False:
            stage = self._stage  # (Not the iterator: the checker must not keep it alive.)
            self._checker = FilterThresholdChecker.for_iterator(self, str(self), where=lambda: stage._name)
        return self._checker

    def __next__(self):
        parent, fn = self._parent, self._fn
        checker = self._threshold_checker()
        while True:
            element = next(parent)
            try:
                passed = fn(element)
            except Exception as e:
                if self._columns is None:
                    note_iterator(e, self, parent)
                raise
            if checker is not None:
                checker.check(passed)
            if passed:
                return element

    def __str__(self) -> str:
        return f"FilterDatasetIterator(transform={filter_name(self._stage._transform)})"

    def describe(self) -> str:
        return f"FilterDatasetIterator(transform={self._stage._name})"


class _FilterChunksIterator(_FilterDatasetIterator):
    """A filter over an iterator that hands over chunks: filters a chunk at a time for a batch above (``chunk.py``)."""

    def take(self, k: int) -> Chunk:
        checker = self._threshold_checker()
        while True:
            chunk = self._parent.take(k)
            values, meta, keep = chunk.values, chunk.meta, []
            if not values:  # (An error before any element.)
                return chunk
            try:
                if meta is not None and self._columns is not None:
                    self._columns.filter_columns(values, meta, keep)
                else:
                    fn, append = self._fn, keep.append
                    for v in values if meta is None else chunk.elements():
                        append(fn(v))
            except BaseException as e:  # (sys.exit() too: noted by a ColumnFunction, then raised at once)
                chunk.fail(len(keep), e)
                if self._columns is None and isinstance(e, Exception):
                    note_iterator(e, self, self._parent)
                if not isinstance(e, Exception):
                    raise
            if checker is not None:
                try:
                    checker.check_all(keep)
                except Exception as e:
                    chunk.fail(checker.failed_at, e)
                    del keep[checker.failed_at :]
            chunk.select(keep)
            if chunk.values or chunk.error is not None:
                return chunk


class FilterIterDataset(TransformIterDataset):
    """Keeps the elements of an IterDataset for which ``fn`` is true."""

    _element_spec = parent_element_spec

    _accepts = FilterTransform
    _method = "filter"

    def __iter__(self) -> DatasetIterator:
        parent = self._parent.__iter__()
        return (_FilterChunksIterator if isinstance(parent, TakesChunks) else _FilterDatasetIterator)(parent, self)

    def __str__(self) -> str:
        return f"FilterIterDataset(transform={filter_name(self._transform)})"
