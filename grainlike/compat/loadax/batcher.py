"""``loadax.batcher``: the function that makes a batch of a list of items."""

from __future__ import annotations

from typing import Callable, Generic, Optional, TypeVar

DatasetItem = TypeVar("DatasetItem")
Batch = TypeVar("Batch")


class Batcher(Generic[DatasetItem, Batch]):
    """Collates the items of one batch with ``batch_fn`` (Loadax's ``Batcher``).

    The loaders hand it a ``list`` of the batch's items, in order. grainlike's own
    API takes the same function as ``Batch(n, batch_fn=fn)`` /
    ``loader(...).batch(n, batch_fn=fn)``.

    Example:
      >>> Batcher(lambda items: sum(items)).batch([1, 2, 3])
      6

    Attributes:
      batch_fn: the function from the list of items to the batch.
      device: kept for Loadax's signature; Loadax does not use it either.
    """

    def __init__(self, batch_fn: Callable[[list], Batch], device: Optional[str] = None):
        self.batch_fn = batch_fn
        self.device = device

    def batch(self, data: list) -> Batch:
        """The batch of ``data``: ``batch_fn(data)``."""
        return self.batch_fn(data)
