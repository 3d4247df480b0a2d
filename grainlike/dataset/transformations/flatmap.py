"""Flat map: each element becomes a sequence of elements (grain's ``FlatMap``).

The transform has ``flat_map(element) -> Sequence`` and, for a MapDataset,
``max_fan_out``: index ``i`` of the result is split ``i % max_fan_out`` of parent
element ``i // max_fan_out`` (None past the element's last split).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional, Sequence

from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.nodes.map_dataset import MapDataset
from grainlike.dataset.transformations.map import UserTransformStage, note_element, note_iterator
from grainlike.dataset.nodes.state import non_negative_int, require_keys


def _splits(flat_map: Callable, element: Any) -> Sequence:
    splits = flat_map(element)
    return splits if isinstance(splits, Sequence) else list(splits)


class FlatMapMapDataset(UserTransformStage, MapDataset):
    """Up to ``transform.max_fan_out`` elements per parent element, None for the rest.

    Raises:
      ValueError: an element splits into more than ``max_fan_out`` elements.
    """

    _accepts = None

    def __len__(self) -> int:
        fan_out = self._transform.max_fan_out
        # An infinite parent stays at sys.maxsize instead of overflowing.
        if len(self._parent) >= sys.maxsize / fan_out:
            return sys.maxsize
        return fan_out * len(self._parent)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        fan_out = self._transform.max_fan_out
        element_index, split = divmod(index, fan_out)
        element = self._parent[element_index]
        if element is None:
            return None
        try:
            splits = _splits(self._transform.flat_map, element)
        except Exception as e:
            note_element(e, self, f"index {index} (parent index {element_index})")
            raise
        if len(splits) > fan_out:
            raise ValueError(
                f"{self}: element {element_index} split into {len(splits)} elements, more "
                f"than max_fan_out={fan_out}. Raise max_fan_out (above ~100 it gets slow) "
                "or preprocess the data to keep the fan-out small."
            )
        return splits[split] if split < len(splits) else None


class _FlatMapDatasetIterator(DatasetIterator):
    """The state is the parent's before the current element, and the split reached."""

    def __init__(self, parent: DatasetIterator, flat_map: Callable, name: str, pretty: Optional[str] = None):
        super().__init__(parent)
        self._flat_map = flat_map
        self._name = name
        self._pretty = name if pretty is None else pretty
        self._buffer: Sequence = []
        self._next_in_buffer = 0
        self._last_parent_state = self._parent.get_state()

    def __next__(self):
        while self._next_in_buffer >= len(self._buffer):
            # Checkpoints re-read the current element instead of storing its splits.
            self._last_parent_state = self._parent.get_state()
            element = next(self._parent)
            self._next_in_buffer = 0
            try:
                self._buffer = _splits(self._flat_map, element)
            except Exception as e:
                note_iterator(e, self, self._parent)
                raise
        value = self._buffer[self._next_in_buffer]
        self._next_in_buffer += 1
        return value

    def get_state(self) -> dict:
        return {"parent": self._last_parent_state, "next_index_in_buffer": self._next_in_buffer}

    def set_state(self, state: dict) -> None:
        require_keys(state, self, ("parent", "next_index_in_buffer"))
        position = non_negative_int(state, "next_index_in_buffer", self)
        self._parent.set_state(state["parent"])
        self._last_parent_state = state["parent"]
        self._next_in_buffer = position
        try:
            self._buffer = _splits(self._flat_map, next(self._parent))
        except StopIteration:
            self._next_in_buffer = 0  # Restored at the end: stays ended.

    def __str__(self) -> str:
        return f"FlatMapDatasetIterator(transform={self._pretty})"

    def describe(self) -> str:
        return f"FlatMapDatasetIterator(transform={self._name})"


class FlatMapIterDataset(UserTransformStage, IterDataset):
    """Each element of ``parent`` replaced by the elements ``transform.flat_map`` returns."""

    _accepts = None

    def __iter__(self) -> DatasetIterator:
        return _FlatMapDatasetIterator(
            self._parent.__iter__(), self._transform.flat_map, self._name, self._pretty_name()
        )
