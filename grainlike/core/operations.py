"""grain's legacy operations: callables from an iterator of ``Record`` to an iterator of ``Record``.

grain 0.2.18 still accepts them in a DataLoader and logs that they are deprecated;
so does grainlike, with the same outputs. ``BatchOperation`` runs as ``Batch``; any
other callable (grain's ``Operation`` protocol) gets each worker's stream of
records. An operation keeps no state: a checkpoint holds positions in the
sampler's stream, so one that holds records back restarts without them, as in grain.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import types
from typing import Any, Callable, Generic, Iterator, Optional, Protocol, Sequence, TypeVar

import numpy as np

from grainlike.core import tree
from grainlike.core.record import Record
from grainlike.core.transforms import (
    Batch,
    Filter,
    Map,
    MapWithIndex,
    RandomMap,
    TfRandomMap,
    as_python_transform,
    is_batch,
    is_flat_map,
    transform_name,
)

_IN = TypeVar("_IN")
_OUT = TypeVar("_OUT")

_logger = logging.getLogger("grainlike")


def _deprecated(name: str, replacement: str) -> None:
    _logger.warning(
        "Applying the deprecated %s (deprecated in grain too); use %s instead.", name, replacement
    )


class Operation(Protocol):
    """A function from a stream of records to a stream of records."""

    def __call__(self, input_iterator: Iterator[Record]) -> Iterator[Record]:
        """Returns the stream of output records."""


def _apply(name: str, kind: str, fn: Callable, records: Iterator[Record], keep_only: bool = False,
           with_rng: bool = False) -> Iterator[Record]:
    """Records with ``fn(data)`` (``fn(data, rng)``), or those ``fn`` keeps; errors wrapped as grain does."""
    _deprecated(name, f"grainlike.{name.replace('Operation', 'Transform')}")
    for record in records:
        try:
            result = fn(record.data, record.metadata.rng) if with_rng else fn(record.data)
        except Exception as e:
            # grain raises ValueError from the function's error; this one also names them.
            raise ValueError(
                f"grainlike encountered an error when calling {kind} function "
                f"{transform_name(fn)} on the record at global index {record.metadata.index}: "
                f"{type(e).__name__}: {e}"
            ) from e
        if not keep_only:
            yield Record(record.metadata.remove_record_key(), result)
        elif result:
            yield Record(record.metadata.remove_record_key(), record.data)


@dataclasses.dataclass
class MapOperation(Generic[_IN, _OUT]):
    """Applies ``map_function`` to each record's data (legacy; use ``MapTransform``).

    Example:
      >>> from grainlike.core.record import RecordMetadata
      >>> op = MapOperation(lambda x: x + 1)
      >>> [r.data for r in op(iter([Record(RecordMetadata(0, 0), 1)]))]
      [2]
    """

    map_function: Callable[[_IN], _OUT]

    def __call__(self, input_iterator: Iterator[Record]) -> Iterator[Record]:
        return _apply("MapOperation", "map", self.map_function, input_iterator)


@dataclasses.dataclass
class RandomMapOperation(Generic[_IN, _OUT]):
    """Applies ``random_map_function(data, rng)`` with each record's own generator.

    Legacy; use ``RandomMapTransform``. The generator is the one a
    ``RandomMapTransform`` at the same place would get, so the draws are the same.
    """

    random_map_function: Callable[[_IN, np.random.Generator], _OUT]

    def __call__(self, input_iterator: Iterator[Record]) -> Iterator[Record]:
        return _apply("RandomMapOperation", "random map", self.random_map_function, input_iterator, with_rng=True)


@dataclasses.dataclass
class FilterOperation(Generic[_IN]):
    """Keeps the records whose data ``condition_function`` accepts (legacy; use ``FilterTransform``)."""

    condition_function: Callable[[_IN], bool]

    def __call__(self, input_iterator: Iterator[Record]) -> Iterator[Record]:
        return _apply("FilterOperation", "condition", self.condition_function, input_iterator, keep_only=True)


@dataclasses.dataclass
class BatchOperation(Generic[_IN, _OUT]):
    """Batches ``batch_size`` consecutive records (legacy; use ``Batch``).

    The DataLoader runs it as ``Batch(batch_size, drop_remainder, batch_fn)``.
    Without a ``batch_fn``, elements must share one structure (else TypeError, as
    in grain) and their leaves are stacked with a new leading axis.

    Attributes:
      batch_size: records per batch, positive.
      drop_remainder: drop a final batch smaller than ``batch_size``.
      batch_fn: function from a list of elements to a batch; defaults to stacking.
    """

    batch_size: int
    drop_remainder: bool = False
    batch_fn: Optional[Callable[[Sequence[_IN]], _OUT]] = None

    def __post_init__(self):
        if self.batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer. Got {self.batch_size}.")
        self._display_deprecation_message = True
        if self.batch_fn is None:
            self.batch_fn = self._default_batch_fn

    def disable_deprecation_message(self) -> None:
        """Stops the warning logged each time the operation starts on a stream."""
        self._display_deprecation_message = False

    def _default_batch_fn(self, elements: Sequence[Any]) -> Any:
        elements = list(elements)
        first = elements[0] if elements else None
        positions: list = []
        differences: list = []
        for position, element in enumerate(elements[1:], start=1):
            try:
                tree.assert_same_structure(first, element)
            except tree.StructureError as e:
                positions.append(position)
                differences.append(f"position {position}: {e}")
        if positions:
            # grain's message (its tests match it), then where each record differs.
            raise TypeError(
                f"Record structures do not match. Record at position 0 has structure {first}, while "
                f"records at positions {positions} have structures {[elements[p] for p in positions]}. "
                f"Differences from position 0: {'; '.join(differences)}."
            )
        return tree.stack(elements)

    def __call__(self, input_iterator: Iterator[Record]) -> Iterator[Record]:
        if self._display_deprecation_message:
            _deprecated("BatchOperation", "grainlike.Batch")
        batch_fn = self.batch_fn
        data: list = []
        last = None
        for record in input_iterator:
            last = record.metadata
            data.append(record.data)
            if len(data) == self.batch_size:
                yield Record(last.remove_record_key(), batch_fn(data))
                data = []
        if data and not self.drop_remainder:
            yield Record(last.remove_record_key(), batch_fn(data))

    def as_batch(self) -> Batch:
        """The ``Batch`` transform the DataLoader runs in place of this operation."""
        return Batch(
            batch_size=self.batch_size, drop_remainder=self.drop_remainder, batch_fn=self.batch_fn
        )


def loader_operation(op: Any, position: int) -> Any:
    """What the DataLoader runs for ``operations[position]``, as grain's DataLoader does.

    A transform or flat map as it is; a ``Batch`` for a (grain's or grainlike's)
    ``BatchOperation`` or grain's ``Batch``; a ``RandomMap`` for a ``TfRandomMap``;
    any other callable as it is, as a legacy ``Operation``.

    Raises:
      TypeError: ``op`` is none of these (named, with its position).
    """
    if isinstance(op, (Batch, Map, RandomMap, Filter, MapWithIndex)):
        return op
    if isinstance(op, TfRandomMap):
        return as_python_transform(op)
    if type(op) is BatchOperation:
        return op.as_batch()
    if is_flat_map(op):
        return op  # Split records, as grain's DataLoader does (loader/flatmap_records.py).
    if not isinstance(op, BatchOperation) and is_batch(op):
        # grain's own Batch / BatchOperation objects: the same meaning.
        return Batch(
            batch_size=op.batch_size,
            drop_remainder=op.drop_remainder,
            batch_fn=getattr(op, "batch_fn", None),
            pad=bool(getattr(op, "pad", False)),
        )
    if isinstance(op, (types.FunctionType, types.BuiltinFunctionType, functools.partial)) and not (
        inspect.isgeneratorfunction(op.func if isinstance(op, functools.partial) else op)
    ):
        # A plain function is almost always a per-record map written as one; run as
        # a legacy Operation it would receive the whole record stream and fail at
        # the first next() with an unrelated TypeError.
        name = getattr(op, "__qualname__", None) or repr(op)
        code = getattr(op, "__code__", None)
        where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
        raise TypeError(
            f"operations[{position}] is the function {name}{where}, not a transform. For a "
            "function of one record, define a MapTransform (grain.transforms.Map) whose "
            "map(x) calls it, or use the Dataset API's MapDataset.map(fn). A legacy Operation "
            "(a function of the iterator of Records) must be a generator function or an "
            "object with __call__."
        )
    if callable(op):
        return op
    raise TypeError(
        f"operations[{position}] is a {type(op).__name__}, not a transform. Use a "
        "MapTransform, RandomMapTransform, FilterTransform, MapWithIndexTransform or "
        "Batch (or a legacy Operation: a callable from an iterator of Records to an "
        "iterator of Records)."
    )
