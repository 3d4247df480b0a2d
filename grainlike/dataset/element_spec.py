"""Element specs: the shapes and dtypes of a dataset's elements, without reading any.

``get_element_spec(ds)`` is grain's: each stage derives its spec from its parent's
(a map with its transform's ``output_spec``), and raises as grain where it cannot.
"""

from __future__ import annotations

import dataclasses
import functools
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


def _map_spec(ds: Any) -> Any:
    from grainlike.core.transforms import transform_name

    transform = ds._transform
    output_spec = getattr(transform, "output_spec", None)
    if not callable(output_spec):
        name = transform_name(transform)
        raise ValueError(
            f"Cannot infer element spec for transform {name} because it does not implement `output_spec` "
            f"method. Implement `{name}.output_spec(self, input_spec: PyTree[ShapeDtypeStructProtocol]) -> "
            " PyTree[ShapeDtypeStructProtocol]` to enable element spec inference."
        )
    return output_spec(get_element_spec(ds._parent))


def _batch_spec(ds: Any) -> Any:
    input_spec = get_element_spec(ds._parent)
    batch_fn = ds._batcher.batch_fn
    if isinstance(batch_fn, functools.partial):
        batch_fn = batch_fn.func
    if batch_fn is not None:
        if callable(getattr(batch_fn, "output_spec", None)):
            return batch_fn.output_spec(input_spec, ds._batch_size, ds._drop_remainder)
        raise NotImplementedError("Element spec inference is not supported with custom batching functions")
    # A short last batch makes the batch dimension unknown.
    size = ds._batch_size if ds._drop_remainder else None
    return map_specs(lambda x: ShapeDtypeStruct(shape=(size,) + tuple(x.shape), dtype=x.dtype), input_spec)


def _rebatch_spec(ds: Any) -> Any:
    def replace_batch_dim(x: Any) -> Any:
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            return x
        return type(x)(shape=(ds._batch_size,) + tuple(x.shape[1:]), dtype=x.dtype)

    return map_specs(replace_batch_dim, get_element_spec(ds._parent))


def _rules() -> list:
    """(stage classes, how their spec follows), most specific first."""
    from grainlike.dataset import batch, cache, filter, interleave, limit, map, mix, multithread, prefetch, rebatch
    from grainlike.dataset import repeat, seed, shuffle, slice, source, zip
    from grainlike.dataset.mp_prefetch import MultiprocessPrefetchIterDataset
    from grainlike.dataset.thread_prefetch import ThreadPrefetchIterDataset

    same_as_parent = (
        filter.FilterMapDataset,
        filter.FilterIterDataset,
        shuffle.ShuffleMapDataset,
        shuffle.WindowShuffleMapDataset,
        shuffle.WindowShuffleIterDataset,
        slice.SliceMapDataset,
        slice.ReindexMapDataset,
        repeat.RepeatMapDataset,
        repeat.RepeatIterDataset,
        limit.LimitIterDataset,
        seed.WithSeedMapDataset,
        seed.WithSeedIterDataset,
        seed.WithOptionsIterDataset,
        prefetch.PrefetchIterDataset,
        ThreadPrefetchIterDataset,
        MultiprocessPrefetchIterDataset,
        cache.CacheIterDataset,
        multithread._MpContextIterDataset,
    )
    return [
        (same_as_parent, lambda ds: get_element_spec(ds._parent)),
        ((source.RangeMapDataset,), lambda ds: ShapeDtypeStruct(shape=(), dtype=np.int64)),
        ((map.ElementwiseMapDataset, map.TransformIterDataset), _map_spec),
        ((batch.BatchMapDataset, batch.BatchIterDataset), _batch_spec),
        ((rebatch.RebatchIterDataset,), _rebatch_spec),
        ((zip.ZipMapDataset, zip.ZipIterDataset), lambda ds: tuple(get_element_spec(p) for p in ds._parents)),
        # Mixed and interleaved datasets are assumed to share one element spec (as grain).
        ((mix.MixedMapDataset, mix.MixedIterDataset), lambda ds: get_element_spec(ds._parents[0])),
        ((interleave.InterleaveIterDataset,), lambda ds: get_element_spec(ds._datasets[0])),
    ]


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
    if getattr(type(ds), "_element_spec", None) is not None:
        return ds._element_spec
    return inferred_element_spec(ds)


def inferred_element_spec(ds: Any) -> Any:
    """The spec of ``ds`` derived by its stage's rule (what ``_element_spec`` returns by default).

    Raises:
      ValueError: a map's transform has no ``output_spec``.
      NotImplementedError: no rule for the stage.
    """
    for classes, rule in _rules():
        if isinstance(ds, classes):
            return rule(ds)
    raise NotImplementedError(f"`element_spec` inference is not implemented for {type(ds).__name__}")
