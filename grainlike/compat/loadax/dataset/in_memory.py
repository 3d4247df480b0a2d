"""``loadax.dataset.in_memory``: a list of items."""

from __future__ import annotations

from typing import Optional, TypeVar

from grainlike.compat.loadax.dataset.protocol import Dataset

DatasetItem = TypeVar("DatasetItem")


class InMemoryDataset(Dataset[DatasetItem]):
    """The items of a list; ``get`` takes negative indices as Python does.

    In grainlike's own API the list itself is the source (or
    ``grainlike.InMemoryDataSource(items)``, which workers share).

    Example:
      >>> InMemoryDataset([1, 2, 3]).get(-1), InMemoryDataset([1, 2, 3]).get(3)
      (3, None)

    Attributes:
      items: the list.
    """

    def __init__(self, items: list):
        self.items = items

    def get(self, index: int) -> Optional[DatasetItem]:
        """``items[index]``; None for ``index >= len``."""
        if index >= len(self.items):
            return None
        if index < 0:
            index = len(self.items) + index
        return self.items[index]

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return f"InMemoryDataset(items={self.items[:2]}...)"
