"""``_Dataset``: what ``MapDataset`` and ``IterDataset`` share as nodes of a pipeline tree."""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar, Union

import numpy as np

T = TypeVar("T")


def parents(node: Any) -> Sequence[Any]:
    """The stages ``node`` reads from (datasets or iterators); () for one that skipped ``super().__init__``."""
    return getattr(node, "_parents", ())


def walk(node: Any, inputs: Callable[[Any], Sequence[Any]] = parents) -> Iterator[Any]:
    """``node`` and every stage above it (its ``inputs``), each once: depth first, the first input first."""
    to_visit, seen = [node], set()
    while to_visit:
        node = to_visit.pop()
        if id(node) not in seen:
            seen.add(id(node))
            yield node
            to_visit.extend(reversed(inputs(node)))


class _Dataset:
    """A node of the pipeline tree; derives default seeds from ``seed()`` calls."""

    def __init__(self, parents: Union["_Dataset", Sequence["_Dataset"]] = ()):
        super().__init__()
        # Set by ``seed()``: seeds the default seeds of downstream random stages.
        self._seed_rng_seed: Optional[int] = None
        self._parents = (parents,) if isinstance(parents, _Dataset) else tuple(parents)

    @property
    def parents(self) -> Sequence[Any]:
        return self._parents

    @property
    def _parent(self) -> Any:
        assert len(self._parents) == 1, self._parents
        return self._parents[0]

    def apply(self, transformations: Any) -> Any:
        """Applies one transform or a sequence of them, dispatching on their type.

        Example:
          >>> from grainlike.core.transforms import Batch
          >>> from grainlike.dataset.nodes.map_dataset import MapDataset
          >>> MapDataset.range(5).apply([Batch(2)])[2].tolist()
          [4]
        """
        return apply_transformations(self, transformations)

    @functools.cached_property
    def _default_seed(self) -> Optional[int]:
        """The seed a random stage uses when none is given (grain's derivation).

        The nearest ``seed()`` on each path up contributes ``(seed, depth)`` to a
        ``SeedSequence`` whose first 32-bit word is the result.
        """
        aggregated: list = []
        to_visit = [(self, 0)]
        while to_visit:
            node, depth = to_visit.pop(0)
            node_seed = getattr(node, "_seed_rng_seed", None)
            if node_seed is not None:
                aggregated.extend((node_seed, depth))
            else:
                to_visit.extend((p, depth + 1) for p in parents(node))
        if not aggregated:
            return None
        return np.random.SeedSequence(aggregated).generate_state(1, dtype=np.uint32)[0]

    @property
    def _element_spec(self) -> Any:
        """The spec of this stage's elements, derived without reading any (grain's hook).

        Each stage class says its own (``grainlike.dataset.nodes.element_spec``); a
        dataset class of your own overrides it to say its spec.

        Raises:
          NotImplementedError: the stage cannot know its spec (as grain).
        """
        raise NotImplementedError(f"`element_spec` inference is not implemented for {type(self).__name__}")

    def describe(self) -> str:
        """This stage as error messages name it, a user transform with its file and line (grainlike only)."""
        return str(self)

    def user_transforms(self) -> tuple:
        """The user's transforms and functions this stage applies, in order (grainlike only)."""
        return ()

    def pipe(self, func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Returns ``func(self, *args, **kwargs)``, to chain custom stages.

        Example:
          >>> from grainlike.dataset.nodes.map_dataset import MapDataset
          >>> MapDataset.range(4).pipe(lambda ds, n: ds.slice(slice(n)), 2)[1]
          1
        """
        return func(self, *args, **kwargs)


def apply_transformations(ds: Any, transformations: Any) -> Any:
    """Applies one transform or a sequence of them to a MapDataset or IterDataset.

    Accepts grainlike's ``Batch``, ``MapTransform``, ``RandomMapTransform``,
    ``MapWithIndexTransform`` and ``FilterTransform``, and flat maps (objects with
    ``flat_map`` and ``max_fan_out``), each applied by the dataset's own method.

    Raises:
      NotImplementedError: a transform of another type (as grain).
    """
    from grainlike.core.transforms import (
        Batch,
        FilterTransform,
        MapTransform,
        MapWithIndexTransform,
        RandomMapTransform,
        is_flat_map,
    )

    if not isinstance(transformations, Sequence):
        transformations = (transformations,)
    for t in transformations:
        if isinstance(t, Batch):
            if t.pad:
                raise NotImplementedError(
                    f"Batch(pad=True) works in the DataLoader only; for a dataset use "
                    f"ds.batch({t.batch_size}, batch_fn=...) to pad ({t})"
                )
            ds = ds.batch(t.batch_size, drop_remainder=t.drop_remainder, batch_fn=t.batch_fn)
        elif isinstance(t, MapTransform):
            ds = ds.map(t)
        elif isinstance(t, RandomMapTransform):
            ds = ds.random_map(t)
        elif isinstance(t, MapWithIndexTransform):
            ds = ds.map_with_index(t)
        elif not isinstance(t, FilterTransform) and is_flat_map(t):
            ds = ds._flat_map(t)
        elif isinstance(t, FilterTransform):
            ds = ds.filter(t)
        else:
            raise NotImplementedError(f"Transformation type: {t} is not supported.")
    return ds
