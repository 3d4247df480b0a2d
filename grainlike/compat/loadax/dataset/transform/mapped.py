"""``loadax.dataset.transform.mapped``: a function applied lazily to each item."""

from __future__ import annotations

from typing import Any, Callable, Optional, TypeVar

from grainlike.compat.loadax.dataset.protocol import Dataset

MappedItem = TypeVar("MappedItem")


class MappedDataset(Dataset[MappedItem]):
    """``map_fn(dataset.get(i))``, computed when item ``i`` is read.

    The loaders read items in their threads (``workers(n)``), so ``map_fn`` runs
    there. In grainlike's own API: ``.map(fn)`` on the builder, or
    ``grainlike.MapDataset.source(source).map(fn)``.

    Example:
      >>> from grainlike.compat.loadax import RangeDataset
      >>> list(MappedDataset(RangeDataset(0, 3), lambda x: x * 2))
      [0, 2, 4]

    Attributes:
      dataset: the dataset mapped.
      map_fn: the function.
    """

    def __init__(self, dataset: Dataset, map_fn: Callable[[Any], MappedItem]):
        self.dataset = dataset
        self.map_fn = map_fn

    def get(self, index: int) -> Optional[MappedItem]:
        """``map_fn`` of the item; None (without a call) where the dataset has none."""
        item = self.dataset.get(index)
        if item is None:
            return None
        return self.map_fn(item)

    def __len__(self) -> int:
        return len(self.dataset)

    def __repr__(self) -> str:
        return f"MappedDataset(dataset={self.dataset}, map_fn={self.map_fn})"
