"""``loadax.dataset.transform.combined``: datasets one after another."""

from __future__ import annotations

from typing import Optional, Sequence, TypeVar

from grainlike.compat.loadax.dataset.protocol import Dataset

DatasetItem = TypeVar("DatasetItem")


class CombinedDataset(Dataset[DatasetItem]):
    """The items of each dataset in turn.

    In grainlike's own API: ``grainlike.MapDataset.concatenate([a, b])``.

    Example:
      >>> from grainlike.compat.loadax import InMemoryDataset
      >>> list(CombinedDataset([InMemoryDataset([1, 2]), InMemoryDataset([3])]))
      [1, 2, 3]

    Attributes:
      datasets: the datasets, in order.
    """

    def __init__(self, datasets: Sequence[Dataset[DatasetItem]]):
        self.datasets = datasets

    def get(self, index: int) -> Optional[DatasetItem]:
        """The item of the dataset that holds position ``index``; None past the end.

        A negative index goes to the first dataset's ``get``, as in Loadax.
        """
        offset = 0
        for dataset in self.datasets:
            size = len(dataset)
            if index < offset + size:
                return dataset.get(index - offset)
            offset += size
        return None

    def __len__(self) -> int:
        return sum(len(dataset) for dataset in self.datasets)

    def __repr__(self) -> str:
        return f"CombinedDataset(datasets={self.datasets})"
