"""Element specs: the shapes and dtypes of a dataset's elements, without reading any.

``get_element_spec(ds)`` is grain's: it asks the stage's ``_element_spec``, which
each stage class defines next to the stage (a map from its transform's
``output_spec``, ``transform_output_spec``; a stage passing its parent's elements
on as ``parent_element_spec``), and which raises as grain where the stage cannot
know it. This module holds what they share: the spec types and the walk over a spec.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar, Optional, Protocol, Tuple

import numpy as np

from grainlike.core import tree


@typing.runtime_checkable
class ShapeDtypeStructProtocol(Protocol):
    """Anything with a ``shape`` and a ``dtype`` (``jax.ShapeDtypeStruct``, an array)."""

    @property
    def shape(self) -> Tuple[Optional[int], ...]: ...

    @property
    def dtype(self) -> Any: ...


@dataclasses.dataclass(slots=True, frozen=True)
class ShapeDtypeStruct(ShapeDtypeStructProtocol):
    """The shape and dtype of one leaf of an element; ``None`` for an unknown dimension.

    Example:
      >>> ShapeDtypeStruct(shape=(None, 3), dtype=np.float32)
      ShapeDtypeStruct(shape=(None, 3), dtype=<class 'numpy.float32'>)
    """

    shape: Tuple[Optional[int], ...]
    dtype: Any
    # A leaf of the spec tree, never walked into (grain's tree functions and
    # jax.tree treat it as one too): output_spec code maps functions over specs.
    tree_leaf: ClassVar[bool] = True


def _is_spec(x: Any) -> bool:
    return isinstance(x, ShapeDtypeStructProtocol)


def map_specs(fn: Any, spec: Any) -> Any:
    """``fn`` applied to each leaf spec of ``spec`` (a leaf spec is not walked into)."""
    return tree.map_structure(fn, spec, is_leaf=_is_spec)


def transform_output_spec(transform: Any, input_spec: Any) -> Any:
    """The spec of ``transform``'s outputs for inputs of ``input_spec``: its ``output_spec``.

    Raises:
      ValueError: the transform has no ``output_spec`` method (grain's message).
    """
    from grainlike.core.transforms import transform_name

    output_spec = getattr(transform, "output_spec", None)  # the user's transform, or a function
    if not callable(output_spec):
        name = transform_name(transform)
        raise ValueError(
            f"Cannot infer element spec for transform {name} because it does not implement `output_spec` "
            f"method. Implement `{name}.output_spec(self, input_spec: PyTree[ShapeDtypeStructProtocol]) -> "
            " PyTree[ShapeDtypeStructProtocol]` to enable element spec inference."
        )
    return output_spec(input_spec)


def get_element_spec(ds: Any) -> Any:
    """The spec of the elements of ``ds``: a tree of ``ShapeDtypeStruct`` like an element.

    Nothing is iterated, read or computed.

    Example:
      >>> from grainlike.dataset import MapDataset
      >>> class AddAxis:
      ...     def map(self, x):
      ...         return {"x": np.full(3, x)}
      ...     def output_spec(self, spec):
      ...         return {"x": ShapeDtypeStruct(shape=(3,), dtype=spec.dtype)}
      >>> ds = MapDataset.range(10).map(AddAxis()).batch(4, drop_remainder=True)
      >>> get_element_spec(ds)
      {'x': ShapeDtypeStruct(shape=(4, 3), dtype=<class 'numpy.int64'>)}

    Raises:
      ValueError: a map's transform has no ``output_spec``.
      NotImplementedError: a stage cannot know its spec (a source that does not
        say it, a custom ``batch_fn`` without ``output_spec``, a flat map).
    """
    if getattr(type(ds), "_element_spec", None) is None:  # not a dataset
        raise NotImplementedError(f"`element_spec` inference is not implemented for {type(ds).__name__}")
    return ds._element_spec


def _parent_element_spec(ds: Any) -> Any:
    return get_element_spec(ds._parent)


# The ``_element_spec`` of a stage whose elements are its parent's (filters,
# shuffles, slices, repeats, prefetches): ``_element_spec = parent_element_spec``.
parent_element_spec = property(_parent_element_spec, doc="The spec of the parent's elements, which this stage passes on.")
