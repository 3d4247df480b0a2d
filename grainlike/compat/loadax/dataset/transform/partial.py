"""``loadax.dataset.transform.partial``: a contiguous part of a dataset."""

from __future__ import annotations

from typing import Optional, Sequence, TypeVar

from grainlike.compat.loadax.dataset.protocol import Dataset

DatasetItem = TypeVar("DatasetItem")


class PartialDataset(Dataset[DatasetItem]):
    """The items ``start_index`` to ``end_index - 1`` of a dataset.

    In grainlike's own API: ``grainlike.MapDataset.source(source)[start:end]``;
    ``split`` is ``.shard(grainlike.ShardOptions(i, n))`` (the same parts).

    Example:
      >>> from grainlike.compat.loadax import InMemoryDataset
      >>> [list(p) for p in PartialDataset.split(InMemoryDataset([1, 2, 3, 4, 5]), 3)]
      [[1, 2], [3, 4], [5]]

    Attributes:
      dataset: the whole dataset.
      start_index: its first index in the part.
      end_index: the index after the part (at most ``len(dataset)``).
    """

    def __init__(self, dataset: Dataset[DatasetItem], start_index: int, end_index: int):
        self.dataset = dataset
        self.start_index = start_index
        self.end_index = min(end_index, len(dataset))

    @staticmethod
    def split(dataset: Dataset[DatasetItem], num_parts: int) -> Sequence[Dataset[DatasetItem]]:
        """``num_parts`` consecutive parts; the first ``len % num_parts`` one item longer."""
        total = len(dataset)
        size, remainder = divmod(total, num_parts)
        parts: list = []
        start = 0
        for i in range(num_parts):
            end = start + size + (1 if i < remainder else 0)
            parts.append(PartialDataset(dataset, start, end))
            start = end
        return parts

    def get(self, index: int) -> Optional[DatasetItem]:
        """The part's item ``index`` (negative from the part's end); None outside it."""
        if index < 0:
            index += len(self)
        if index < 0 or index >= len(self):
            return None
        return self.dataset.get(index + self.start_index)

    def __len__(self) -> int:
        return max(0, self.end_index - self.start_index)
