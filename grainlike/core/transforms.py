"""The operations a user chains after the source: map, random map, filter, batch.

Each user-facing transform is a small abstract class with one method. The classes
have grain's names (``grain.transforms.Map``, ...) and its ``grain.python`` aliases
(``MapTransform is Map``), so code written for grain subclasses them unchanged.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import inspect
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from grainlike.core import tree


class Map(abc.ABC):
    """A 1:1 transformation of one element (``grain.transforms.Map``).

    Also named ``MapTransform``, as in ``grain.python``.

    Example:
      >>> class Double(Map):
      ...     def map(self, element):
      ...         return element * 2
      >>> Double().map(3)
      6
    """

    @abc.abstractmethod
    def map(self, element: Any) -> Any:
        """Returns the transformed element."""


class RandomMap(abc.ABC):
    """A 1:1 random transformation of one element (``grain.transforms.RandomMap``).

    Also named ``RandomMapTransform``. ``rng`` is the record's own generator, keyed
    on the sampler's seed and the record's global index, so the result does not
    depend on worker count or timing and is reproduced exactly after a restore.
    """

    @abc.abstractmethod
    def random_map(self, element: Any, rng: np.random.Generator) -> Any:
        """Returns the transformed element, drawing randomness only from ``rng``."""


class TfRandomMap(abc.ABC):
    """grain's random map for its TensorFlow backend, applied in Python by the DataLoader.

    grain's DataLoader calls ``np_random_map(element, rng)`` with the record's
    generator, exactly as ``RandomMap.random_map``; grainlike does the same (no
    TensorFlow involved).
    """

    @abc.abstractmethod
    def np_random_map(self, element: Any, rng: np.random.Generator) -> Any:
        """Returns the transformed element, drawing randomness only from ``rng``."""


class MapWithIndex(abc.ABC):
    """A 1:1 transformation of one element and its global index in the stream.

    Also named ``MapWithIndexTransform``.
    """

    @abc.abstractmethod
    def map_with_index(self, index: int, element: Any) -> Any:
        """Returns the transformed element; ``index`` is the record's global index."""


class Filter(abc.ABC):
    """Keeps the elements for which ``filter`` returns True.

    Also named ``FilterTransform``.
    """

    @abc.abstractmethod
    def filter(self, element: Any) -> bool:
        """Returns True to keep ``element``."""


class FlatMap(abc.ABC):
    """Splits one element into up to ``max_fan_out`` elements.

    Named ``FlatMapTransform`` in ``grain.experimental``.

    Attributes:
      max_fan_out: the most elements one element may split into.
    """

    max_fan_out: int

    @abc.abstractmethod
    def flat_map(self, element: Any) -> Sequence[Any]:
        """Returns the elements ``element`` splits into."""


def is_flat_map(op: Any) -> bool:
    """Whether ``op`` is a flat map: a ``FlatMap``, or grain's (``flat_map`` and ``max_fan_out``)."""
    return isinstance(op, FlatMap) or (callable(getattr(op, "flat_map", None)) and hasattr(op, "max_fan_out"))


def is_batch(op: Any) -> bool:
    """Whether ``op`` batches: a ``Batch``, or grain's (``batch_size`` and ``drop_remainder``)."""
    return isinstance(op, Batch) or (getattr(op, "batch_size", None) is not None and hasattr(op, "drop_remainder"))


# grain.python's names for the same classes.
MapTransform = Map
RandomMapTransform = RandomMap
MapWithIndexTransform = MapWithIndex
FilterTransform = Filter
FlatMapTransform = FlatMap


class _NpRandomMap(RandomMap):
    """A ``TfRandomMap`` run as the ``RandomMap`` it is to a Python pipeline."""

    def __init__(self, transform: TfRandomMap):
        # transform_name() names the wrapped transform in error notes.
        self.__wrapped__ = transform

    def random_map(self, element: Any, rng: np.random.Generator) -> Any:
        return self.__wrapped__.np_random_map(element, rng)

    def __repr__(self) -> str:
        return repr(self.__wrapped__)


def as_python_transform(transform: Any) -> Any:
    """The transform a Python pipeline applies for ``transform``.

    A ``TfRandomMap`` becomes a ``RandomMap`` calling its ``np_random_map``; any
    other transform is returned as it is.
    """
    if isinstance(transform, TfRandomMap) and not isinstance(transform, RandomMap):
        return _NpRandomMap(transform)
    return transform


@dataclasses.dataclass(frozen=True)
class Batch:
    """Stacks consecutive elements into a batch with a new leading dimension.

    Nested dicts / tuples / lists of numpy arrays and scalars are stacked leaf by
    leaf. Within a DataLoader with workers each worker batches its own records.

    Attributes:
      batch_size: number of elements per batch.
      drop_remainder: drop a final batch smaller than ``batch_size``.
      batch_fn: optional function from a list of elements to a batch, replacing
        the default stacking.
      pad: (grainlike only) fill a short final batch up to ``batch_size`` with
        all-zero elements and add a boolean ``mask`` leaf, True for real elements.
        Every batch of the loader then has the same structure and shapes, which
        is what a jitted step needs. A dict element gets a ``"mask"`` key (the
        element must not have one); any other element ``x`` becomes
        ``{"data": x, "mask": mask}``. With ``batch_fn`` the padded list of
        elements is passed to it and the mask is added to its result the same
        way. Records a padding sampler marks as padding
        (``grainlike.PaddedEpochSampler``) are zeroed and masked too.

    Example:
      >>> Batch(batch_size=32, drop_remainder=True).batch_size
      32
    """

    batch_size: int
    drop_remainder: bool = False
    batch_fn: Optional[Callable[[Sequence[Any]], Any]] = None
    # Out of the repr: grain's repr of the same Batch has no pad.
    pad: bool = dataclasses.field(default=False, repr=False)

    def __post_init__(self):
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, (int, np.integer)):
            raise TypeError(f"batch_size must be an int, got {self.batch_size!r}")
        if self.batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {self.batch_size}")
        if not isinstance(self.pad, bool):
            raise TypeError(f"pad must be a bool, got {self.pad!r}")
        if self.pad and self.drop_remainder:
            raise ValueError(
                "Batch: pad=True pads the final batch, drop_remainder=True drops it; "
                "choose one (got both True)"
            )


def describe_op(op: Any) -> str:
    """How errors and stages name an operation."""
    if isinstance(op, Batch):
        pad = ", pad=True" if op.pad else ""
        return f"Batch(batch_size={op.batch_size}, drop_remainder={op.drop_remainder}{pad})"
    return transform_name(op)


def batch_elements(op: Batch, values: Sequence[Any], indices: Sequence[int] = (), padding: Any = None,
                   alloc: Optional[tree.Allocator] = None) -> Any:
    """The batch ``op`` makes of ``values`` (at most ``op.batch_size`` elements): the one way to batch.

    ``op.batch_fn(values)``, else ``tree.stack``. With ``op.pad``, a short batch is
    filled up with all-zero elements, the elements that ``padding`` marks as padding
    are zeroed, and the mask (True for real elements) is added: as the ``"mask"``
    key of a dict batch, else as ``{"data": batch, "mask": mask}``.

    Args:
      op: the Batch.
      values: the elements.
      indices: their global indices, where ``padding`` is given.
      padding: the sampler (``locate``) whose padding the Batch masks, or None.
      alloc: allocator for the stacked leaves, or None.

    Raises:
      ValueError: with ``pad``, a dict batch that has a ``"mask"`` key already.
    """
    if not op.pad:
        return op.batch_fn(values) if op.batch_fn is not None else tree.stack(values, alloc)
    size, values = op.batch_size, list(values)
    mask = np.zeros(size, dtype=bool)
    mask[: len(values)] = True
    if padding is not None:
        flags = padding.locate(np.array(indices, np.int64)).padding
        if flags is not None:
            for i in np.flatnonzero(flags).tolist():
                mask[i] = False
                values[i] = tree.zeros_like(values[i])
    if len(values) < size:
        values.extend([tree.zeros_like(values[0])] * (size - len(values)))
    data = op.batch_fn(values) if op.batch_fn is not None else tree.stack(values, alloc)
    if not isinstance(data, dict):
        return {"data": data, "mask": mask}
    if "mask" in data:
        raise ValueError(
            f"{describe_op(op)}: the elements already have a 'mask' key, where pad=True "
            "puts the padding mask; rename that key"
        )
    if type(data) is dict:
        return {**data, "mask": mask}
    out = copy.copy(data)  # keeps the subclass (and a defaultdict's factory)
    out["mask"] = mask
    return out


Transformation = Union[Batch, Map, RandomMap, TfRandomMap, Filter, FlatMap, MapWithIndex]
Transformations = Sequence[Transformation]


def get_pretty_transform_name(transform: Any) -> str:
    """A transform's name in a dataset's ``str()``, as grain 0.2.18 writes it.

    A transform object is named by its class (or by its own ``str()`` if its
    class defines ``__str__`` or ``__repr__``); a function by its name, the last
    three parts of its file and its line: ``"<lambda> @ .../pkg/mod.py:12"``.
    Error messages name transforms with ``transform_name`` instead, which gives
    the full file of a class too.

    Example:
      >>> class Plus(Map):
      ...     def map(self, x):
      ...         return x + 1
      >>> get_pretty_transform_name(Plus())
      'Plus'
    """
    if isinstance(transform, MapWithIndex):
        # grain's datasets keep (and name) the bound method of these.
        transform = transform.map_with_index
    elif isinstance(transform, (Batch, Map, RandomMap, TfRandomMap, Filter, FlatMap)):
        cls = type(transform)
        if cls.__str__ is object.__str__ and cls.__repr__ is object.__repr__:
            return cls.__name__
        return str(transform)
    name = getattr(transform, "__name__", None) or repr(transform)
    try:
        source = inspect.getsourcefile(transform)
        if source is None:
            return name
        parts = source.split("/")
        if len(parts) >= 3:
            source = ".../" + "/".join(parts[-3:])
        return f"{name} @ {source}:{inspect.getsourcelines(transform)[1]}"
    except (OSError, TypeError):
        return name


def transform_name(transform: Any) -> str:
    """A readable name for a transform: its class and where it was defined."""
    wrapped = getattr(transform, "__wrapped__", None)
    if wrapped is not None and not inspect.isclass(transform):
        # A transform wrapping a plain function (grainlike's builder): name the function.
        transform = wrapped
    cls = transform if inspect.isclass(transform) else type(transform)
    is_function = inspect.isfunction(transform)
    name = getattr(transform, "__qualname__", None) if is_function else cls.__qualname__
    try:
        if is_function:  # Its code object knows its line: no source to parse.
            code = transform.__code__
            where = f"{code.co_filename}:{code.co_firstlineno}"
        else:
            where = f"{inspect.getsourcefile(cls)}:{inspect.getsourcelines(cls)[1]}"
    except Exception:  # noqa: BLE001 - a name is only decoration (inspect parses files; it can fail oddly)
        where = None
    return f"{name} ({where})" if where else str(name)
