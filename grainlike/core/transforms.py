"""The operations a user chains after the source: map, random map, filter, batch.

Each user-facing transform is a small abstract class with one method. The classes
are the same shape as ``grain.python``'s, so code written for grain subclasses them
unchanged.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np


class MapTransform(abc.ABC):
    """A 1:1 transformation of one element.

    Example:
      >>> class Double(MapTransform):
      ...     def map(self, element):
      ...         return element * 2
      >>> Double().map(3)
      6
    """

    @abc.abstractmethod
    def map(self, element: Any) -> Any:
        """Returns the transformed element."""


class RandomMapTransform(abc.ABC):
    """A 1:1 random transformation of one element.

    ``rng`` is the record's own generator, keyed on the sampler's seed and the
    record's global index, so the result does not depend on worker count or timing
    and is reproduced exactly after a restore.
    """

    @abc.abstractmethod
    def random_map(self, element: Any, rng: np.random.Generator) -> Any:
        """Returns the transformed element, drawing randomness only from ``rng``."""


class MapWithIndexTransform(abc.ABC):
    """A 1:1 transformation of one element and its global index in the stream."""

    @abc.abstractmethod
    def map_with_index(self, index: int, element: Any) -> Any:
        """Returns the transformed element; ``index`` is the record's global index."""


class FilterTransform(abc.ABC):
    """Keeps the elements for which ``filter`` returns True."""

    @abc.abstractmethod
    def filter(self, element: Any) -> bool:
        """Returns True to keep ``element``."""


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
    pad: bool = False

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


Transformation = Union[Batch, MapTransform, RandomMapTransform, FilterTransform, MapWithIndexTransform]
Transformations = Sequence[Transformation]


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
        defined = transform if is_function else cls
        where = f"{inspect.getsourcefile(defined)}:{inspect.getsourcelines(defined)[1]}"
    except (OSError, TypeError):
        where = None
    return f"{name} ({where})" if where else str(name)
