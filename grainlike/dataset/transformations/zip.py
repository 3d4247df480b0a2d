"""Zipping datasets: element ``i`` is the tuple of every parent's element ``i``."""

from __future__ import annotations

from typing import Sequence

from grainlike.dataset.nodes.element_spec import get_element_spec
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.nodes.map_dataset import MapDataset
from grainlike.dataset.nodes.state import parent_states, require_keys, set_all_or_none


class ZipMapDataset(MapDataset):
    """Tuples of the parents' elements; the parents must have the same length.

    Raises:
      ValueError: no parents, or parents of different lengths.
    """

    @property
    def _element_spec(self) -> tuple:
        return tuple(get_element_spec(p) for p in self._parents)

    def _own_work_waits(self) -> bool:
        return False  # it only groups elements

    def __init__(self, parents: Sequence[MapDataset]):
        super().__init__(parents)
        lengths = [len(p) for p in self._parents]
        if not lengths:
            raise ValueError("At least one parent must be provided.")
        if any(n != lengths[0] for n in lengths):
            raise ValueError(f"All parents must have the same length, got lengths {lengths}.")
        self._length = lengths[0]

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        return tuple(p[index] for p in self._parents)

    def _getitems(self, indices: Sequence[int]) -> list:
        return list(zip(*[p._getitems(indices) for p in self._parents]))

    def __str__(self) -> str:
        # grain's text, its missing closing parenthesis included.
        return f"ZipMapDataset(parents={self._parents}"


def _strict_zip_error(i: int, why: str) -> str:
    plural = " " if i == 1 else "s 1-"
    return f"ZipIterDataset argument {i + 1} is {why} than argument{plural}{i}"


class _ZipDatasetIterator(DatasetIterator):
    def __init__(self, parents: Sequence[DatasetIterator], strict: bool):
        super().__init__(parents)
        self._strict = strict

    def __next__(self) -> tuple:
        items = []
        for i, it in enumerate(self._parents):
            try:
                items.append(next(it))
            except StopIteration as end:
                if self._strict:
                    # As Python's zip(strict=True): the first iterator to end
                    # decides; every other must end at the same step.
                    if i > 0:
                        raise ValueError(_strict_zip_error(i, "shorter")) from end
                    for j in range(1, len(self._parents)):
                        try:
                            next(self._parents[j])
                        except StopIteration:
                            continue
                        raise ValueError(_strict_zip_error(j, "longer")) from end
                raise
        return tuple(items)

    def get_state(self) -> dict:
        return {"parents": [it.get_state() for it in self._parents]}

    def set_state(self, state: dict) -> None:
        require_keys(state, self, ("parents",))
        set_all_or_none(list(zip(self._parents, parent_states(state, self, len(self._parents)))))

    def __str__(self) -> str:
        return f"ZipDatasetIterator([{len(self._parents)} parents])"


class ZipIterDataset(IterDataset):
    """Tuples of the parents' elements, stopping with the first parent to end.

    Args:
      parents: the datasets to zip.
      strict: raise ``ValueError`` if the parents end at different steps.

    Raises:
      ValueError: no parents.
    """

    @property
    def _element_spec(self) -> tuple:
        return tuple(get_element_spec(p) for p in self._parents)

    def __init__(self, parents: Sequence[IterDataset], *, strict: bool = True):
        super().__init__(parents)
        if not self._parents:
            raise ValueError("At least one parent must be provided.")
        self._strict = strict

    def __iter__(self) -> DatasetIterator:
        return _ZipDatasetIterator([p.__iter__() for p in self._parents], self._strict)

    def __str__(self) -> str:
        return f"ZipIterDataset(parents={self._parents}, strict={self._strict})"
