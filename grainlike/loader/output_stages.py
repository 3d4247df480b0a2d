"""The DataLoader's top stages: each record's data, and grain's legacy state.

* ``RecordDataIterDataset``: a record's data (grain's ``map(lambda r: r.data)``),
  what the DataLoader yields; it hands a worker's shared-memory allocator to the
  stage that stacks batches.
* ``LoaderStateIterDataset``: the top, whose state is grain's legacy JSON object
  (``grainlike.loader.legacy_state``); after an error in ``next()`` it goes on
  from the last delivered output.

The stages below them are the Dataset API's over the sampler's records
(``records.py``, ``record_transforms.py``); ``pipeline.py`` composes them.
"""

from __future__ import annotations

from typing import Any, Optional

from grainlike.core import tree
from grainlike.core.protocols import TakesAllocator
from grainlike.dataset.nodes.dataset_node import walk
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.transformations.map import PassThroughStateIterator
from grainlike.dataset.transformations.prefetch import NextIndexState
from grainlike.loader import legacy_state as state_lib


class _RecordDataIterator(PassThroughStateIterator):
    def __init__(self, parent: DatasetIterator):
        super().__init__(parent)
        self._pull = parent.__next__

    def __next__(self) -> Any:
        return self._pull().data

    def __str__(self) -> str:
        return "RecordDataIterator"


class RecordDataIterDataset(IterDataset):
    """Each record's data: what the DataLoader yields (grain's ``map(lambda r: r.data)``)."""

    def set_allocator(self, alloc: Optional[tree.Allocator]) -> None:
        """Gives ``alloc`` to the nearest stage upstream that stacks batches.

        A worker calls it so that its batches are written once, into shared
        memory.
        """
        stacker = next((node for node in walk(self._parent) if isinstance(node, TakesAllocator)), None)
        if stacker is not None:
            stacker.set_allocator(alloc)

    def __iter__(self) -> DatasetIterator:
        return _RecordDataIterator(self._parent.__iter__())

    def __str__(self) -> str:
        return "RecordDataIterDataset"


def _reading_stage(it: DatasetIterator) -> Optional[DatasetIterator]:
    """The stage reading the sampler's records under ``it`` (None: it runs in workers)."""
    # The loader's stages form a chain; the one with a next_index reads the records.
    return next((node for node in walk(it) if isinstance(node, NextIndexState)), None)


class LoaderStateIterDataset(IterDataset):
    """The DataLoader's top stage: its state is grain's legacy JSON object.

    Args:
      parent: the records' data, computed in process or by ``mp_prefetch``.
      codec: converts this loader's states (see ``state.LegacyState``).
    """

    def __init__(self, parent: IterDataset, codec: state_lib.LegacyState):
        super().__init__(parent)
        self._codec = codec

    def __iter__(self) -> "LoaderStateDatasetIterator":
        return LoaderStateDatasetIterator(self._parent.__iter__(), self._codec)

    def __str__(self) -> str:
        return f"LoaderStateIterDataset(worker_count={self._codec.worker_count})"


class LoaderStateDatasetIterator(DatasetIterator):
    """Converts between grain's legacy state and the Dataset state below it.

    After an exception in ``next()`` the next call goes on from the last
    delivered output (the records of a batch cut short are read again): with
    workers ``mp_prefetch`` restarts them from there; in process this stage
    moves the reading stage back.
    """

    def __init__(self, parent: DatasetIterator, codec: state_lib.LegacyState):
        super().__init__(parent)
        self._codec = codec
        self._reader = _reading_stage(parent) if codec.worker_count == 0 else None
        self._pull = parent.__next__

    def __next__(self) -> Any:
        reader = self._reader
        if reader is None:
            return self._pull()
        delivered = reader._get_next_index()
        try:
            return self._pull()
        except StopIteration:
            raise
        except BaseException:
            try:
                self._parent.set_state({"next_index": delivered})
            except Exception:  # Never hide the original error.
                pass
            raise

    def get_state(self) -> dict:
        return self._codec.encode(self._codec.from_dataset_state(self._parent.get_state()))

    def set_state(self, state: dict) -> None:
        """Restores a legacy state, checked completely before anything changes.

        Raises:
          InvalidStateError: the state is malformed or belongs to another pipeline.
        """
        positions = self._codec.decode(state)
        self._parent.set_state(self._codec.to_dataset_state(positions))

    def __str__(self) -> str:
        return f"LoaderStateDatasetIterator(worker_count={self._codec.worker_count})"
