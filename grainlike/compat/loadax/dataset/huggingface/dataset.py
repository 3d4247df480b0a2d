"""``loadax.dataset.huggingface.dataset``: a Hugging Face ``datasets.Dataset``."""

from __future__ import annotations

from typing import Any, Optional, TypeVar

from grainlike.compat.loadax.dataset.protocol import Dataset

DatasetItem = TypeVar("DatasetItem")


class HuggingFaceDataset(Dataset[DatasetItem]):
    """The rows of a Hugging Face dataset: ``get(i)`` is ``dataset[i]``.

    In grainlike's own API a ``datasets.Dataset`` is a source as it is, or
    ``grainlike.sources.HuggingFaceDataSource`` reads it by batches (docs/sources.md).

    Attributes:
      dataset: the ``datasets.Dataset``.
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def get(self, index: int) -> Optional[DatasetItem]:
        """Row ``index`` (the ``datasets`` library's indexing and errors)."""
        return self.dataset[index]

    def __len__(self) -> int:
        return len(self.dataset)

    @staticmethod
    def from_hub(path: str, name: Optional[str] = None, split: Optional[str] = None, *,
                 trust_remote_code: bool = False) -> "HuggingFaceDataset":
        """Loads ``path`` from the Hugging Face hub with numpy-formatted rows.

        Raises:
          AssertionError: ``split`` left a ``DatasetDict`` rather than one ``Dataset``.
        """
        import datasets

        dataset = datasets.load_dataset(path=path, name=name, split=split, trust_remote_code=trust_remote_code)
        dataset.set_format(type="numpy")
        if not isinstance(dataset, datasets.Dataset):
            raise AssertionError(f"loaded dataset must be a Dataset, got {type(dataset)}")
        return HuggingFaceDataset(dataset)
