"""``loadax.dataloader.protocol``: what a loader and its iterators provide."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from grainlike.compat.loadax.dataloader.progress import Progress

DatasetItem = TypeVar("DatasetItem", covariant=True)
Batch = TypeVar("Batch", covariant=True)


class DataloaderIteratorProtocol(Protocol[DatasetItem, Batch]):
    """An iterator over a loader's batches that reports its progress."""

    def progress(self) -> Progress:
        """How far the iterator has read."""
        ...

    def __next__(self) -> Batch:
        """The next batch; blocks until it is ready."""
        ...


class DataloaderProtocol(Protocol, Generic[DatasetItem, Batch]):
    """A loader: a configuration; each ``iter()`` reads from the start."""

    def __iter__(self) -> DataloaderIteratorProtocol[DatasetItem, Batch]:
        """A new iterator from the first batch."""
        raise NotImplementedError

    def num_items(self) -> int:
        """The number of items of the dataset."""
        raise NotImplementedError
