"""``loadax.strategy``: how many loaded items make a batch."""

from __future__ import annotations

from collections import deque
from typing import Generic, Optional, Protocol, TypeVar

DatasetItem = TypeVar("DatasetItem")


class BatchStrategy(Protocol, Generic[DatasetItem]):
    """Collects loaded items and says when they make a batch.

    The loaders read ``batch_size`` indices per batch, ``add`` the items that
    loaded, then take ``batch(force=True)``.
    """

    batch_size: int

    def add(self, item: DatasetItem) -> None:
        """Adds one loaded item."""
        ...

    def batch(self, *, force: bool) -> Optional[list]:
        """The next batch's items, or None when there is none yet."""
        ...

    def clone(self) -> "BatchStrategy[DatasetItem]":
        """A copy holding the same pending items."""
        ...


class FixedBatchStrategy(BatchStrategy[DatasetItem]):
    """Batches of ``batch_size`` items; with ``force``, whatever is pending.

    grainlike's own API says the same with ``Batch(batch_size)`` (the last batch
    shorter unless ``drop_remainder=True``).

    Example:
      >>> s = FixedBatchStrategy(2)
      >>> for x in (1, 2, 3):
      ...     s.add(x)
      >>> s.batch(force=False), s.batch(force=False), s.batch(force=True)
      ([1, 2], None, [3])
    """

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self.items: deque = deque()

    def add(self, item: DatasetItem) -> None:
        """Adds one loaded item."""
        self.items.append(item)

    def batch(self, *, force: bool) -> Optional[list]:
        """``batch_size`` pending items, or with ``force`` all of them; else None."""
        if len(self.items) >= self.batch_size:
            return [self.items.popleft() for _ in range(self.batch_size)]
        if force and self.items:
            # Taken out, unlike Loadax 0.2.1, which hands them over and keeps them:
            # its NaiveDataloader then repeats a short last batch forever, and a
            # Dataloader's next pass starts with the previous pass's last items.
            items = list(self.items)
            self.items.clear()
            return items
        return None

    def clone(self) -> "FixedBatchStrategy[DatasetItem]":
        """A copy holding the same pending items."""
        copy: FixedBatchStrategy = FixedBatchStrategy(self.batch_size)
        copy.items = self.items.copy()
        return copy
