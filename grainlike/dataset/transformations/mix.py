"""Mixing datasets: by weights (Map and Iter), by a selection map, and concatenation.

Weights become grain's integer proportions, and element ``k`` comes from the
dataset grain's ``_dataset_and_key_of_next_element`` picks, so the order is grain's.
"""

from __future__ import annotations

import bisect
import itertools
import sys
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from grainlike.core.errors import StateTypeError, _CountMismatch, add_note
from grainlike.dataset.nodes.element_spec import get_element_spec
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.nodes.map_dataset import DatasetSelectionMap, MapDataset
from grainlike.dataset.nodes.state import non_negative_int, parent_states, require_keys, set_all_or_none


def int_proportions(weights: Optional[Sequence[float]], count: int) -> list:
    """grain's integer proportions: ones by default, else scaled so the smallest is 100.

    Raises:
      ValueError: a weight is zero, or the number of weights is not ``count``.
    """
    if weights is None:
        return [1] * count
    weights = list(weights)
    if 0 in weights:
        raise ValueError(f"Must specify all non-zero proportions for mixing. Got {weights}.")
    scale = 100 / min(weights)
    proportions = [int(w * scale) for w in weights]
    if len(proportions) != count:
        raise _CountMismatch(f"Got {len(proportions)} weights for {count} datasets: {weights}")
    return proportions


def select_one(k: int, proportions: Sequence[int]) -> tuple[int, int]:
    """(dataset, index within it) of element ``k`` of the mixture."""
    remaining = sum(proportions)
    ck, ck1 = k, k + 1
    for i, p in enumerate(proportions):
        nk = ck * (remaining - p) // remaining
        nk1 = ck1 * (remaining - p) // remaining
        count = ck1 - nk1
        if ck - nk != count:
            return i, count - 1
        remaining -= p
        ck, ck1 = nk, nk1
    raise AssertionError(f"no dataset selected for element {k} with proportions {proportions}")


def select_many(ks: np.ndarray, proportions: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``select_one`` for an int64 array of elements at once."""
    total = sum(proportions)
    if ks.size == 0 or (int(ks.max()) + 1) * total >= 2**62:  # Would overflow int64.
        pairs = [select_one(int(k), proportions) for k in ks.tolist()]
        return np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.int64)
    which = np.full(ks.shape, -1, np.int64)
    key = np.zeros(ks.shape, np.int64)
    open_ = np.ones(ks.shape, bool)
    remaining = total
    ck, ck1 = ks, ks + 1
    for i, p in enumerate(proportions):
        nk = ck * (remaining - p) // remaining
        nk1 = ck1 * (remaining - p) // remaining
        count = ck1 - nk1
        hit = open_ & ((ck - nk) != count)
        which[hit] = i
        key[hit] = count[hit] - 1
        open_ &= ~hit
        remaining -= p
        ck, ck1 = nk, nk1
    return which, key


class _BatchedSelectionMap(DatasetSelectionMap):
    """A selection map that also selects for many indices at once."""

    def select(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError


class SelectionWithProportionsMap(_BatchedSelectionMap):
    """Mixes by proportions; as long as no element of any dataset repeats.

    Raises:
      ValueError: a weight is zero, or a dataset is empty.
    """

    def __init__(self, parents: Sequence[MapDataset], proportions: Optional[Sequence[float]] = None):
        proportions = int_proportions(proportions, len(parents))
        self._proportions = tuple(proportions)
        weight_sum = sum(proportions)
        lengths = [len(p) / (w / weight_sum) for p, w in zip(parents, proportions)]
        empty = [f"index {i} ({parents[i]})" for i, n in enumerate(lengths) if n == 0]
        if empty:
            raise ValueError(
                "All datasets must have positive length for mixing, but dataset(s) "
                f"at {', '.join(empty)} have length 0."
            )
        self._length = min(sys.maxsize, int(min(lengths)))

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> tuple[int, int]:
        return select_one(index, self._proportions)

    def select(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return select_many(indices, self._proportions)

    def __repr__(self) -> str:
        return f"SelectionWithProportionsMap(proportions={self._proportions}, length={self._length})"


class ConcatSelectionMap(_BatchedSelectionMap):
    """All of dataset 0, then all of dataset 1, ...; epoch ``e`` reads their epoch ``e``.

    Raises:
      ValueError: a dataset is infinite.
    """

    def __init__(self, parents: Sequence[MapDataset]):
        sizes = [len(p) for p in parents]
        for i, size in enumerate(sizes):
            if size >= sys.maxsize:
                raise ValueError(f"Cannot concatenate infinite datasets. {parents[i]} is infinite.")
        self._sizes = sizes
        self._cumulative = list(itertools.accumulate(sizes, initial=0))

    def __len__(self) -> int:
        return self._cumulative[-1]

    def __getitem__(self, index: int) -> tuple[int, int]:
        epoch, in_epoch = divmod(index, len(self))
        which = bisect.bisect_right(self._cumulative, in_epoch) - 1
        return which, in_epoch - self._cumulative[which] + epoch * self._sizes[which]

    def select(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        total = len(self)
        if total == 0:
            raise ZeroDivisionError(f"cannot select index {indices[0]} of an empty concatenation")
        epoch, in_epoch = np.divmod(indices, total)
        cumulative = np.asarray(self._cumulative, np.int64)
        which = np.searchsorted(cumulative, in_epoch, side="right") - 1
        sizes = np.asarray(self._sizes, np.int64)
        return which, in_epoch - cumulative[which] + epoch * sizes[which]


class MixedMapDataset(MapDataset):
    """Element ``i`` is ``parents[d][j]`` for ``(d, j) = selection_map[i]``.

    Raises:
      ValueError: both ``proportions`` and ``selection_map`` are given, or the
        proportions are invalid (see ``SelectionWithProportionsMap``).
    """

    @property
    def _element_spec(self) -> Any:
        # The mixed datasets are assumed to share one element spec (as grain).
        return get_element_spec(self._parents[0])

    def _own_work_waits(self) -> bool:
        return False  # it only maps indices

    def __init__(
        self,
        parents: Sequence[MapDataset],
        proportions: Optional[Sequence[float]] = None,
        selection_map: Optional[DatasetSelectionMap] = None,
    ):
        super().__init__(parents)
        if proportions is not None and selection_map is not None:
            raise ValueError("Cannot set both proportions and selection_map.")
        if selection_map is None:
            selection_map = SelectionWithProportionsMap(self._parents, proportions)
        self._selection_map = selection_map
        self._length = len(selection_map)

    def __len__(self) -> int:
        return self._length

    def __str__(self) -> str:
        return f"MixedMapDataset[{len(self._parents)} parents]"

    def __repr__(self) -> str:
        # Lengths, not the parents' reprs: user datasets rarely have a stable repr.
        return (
            f"MixedMapDataset(parent_lengths={[len(p) for p in self._parents]}, "
            f"selection_map={self._selection_map!r})"
        )

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        which, key = self._selection_map[index]
        try:
            return self._parents[which][key]
        except Exception as e:
            add_note(e, f"grainlike: in {self}, reading index {key} of dataset {which} (for index {index})")
            raise

    def _getitems(self, indices: Sequence[int]) -> list:
        if isinstance(self._selection_map, _BatchedSelectionMap):
            which, keys = self._selection_map.select(np.asarray(indices, np.int64).reshape(-1))
            which, keys = which.tolist(), keys.tolist()
        else:
            pairs = [self._selection_map[i] for i in indices]
            which, keys = [p[0] for p in pairs], [p[1] for p in pairs]
        grouped: dict = {}
        for position, (w, k) in enumerate(zip(which, keys)):
            group = grouped.setdefault(w, ([], []))
            group[0].append(position)
            group[1].append(k)
        out: list = [None] * len(which)
        for w, (positions, group_keys) in grouped.items():
            try:
                values = self._parents[w]._getitems(group_keys)
            except Exception as e:
                add_note(e, f"grainlike: in {self}, reading dataset {w}")
                raise
            for position, value in zip(positions, values):
                out[position] = value
        return out


class ConcatenateMapDataset(MixedMapDataset):
    """The elements of each dataset in turn."""

    def __init__(self, parents: Sequence[MapDataset]):
        super().__init__(parents, selection_map=ConcatSelectionMap(tuple(parents)))


def _flat(structure: Union[Sequence[Any], Mapping[str, Any]]) -> tuple[list, Optional[list]]:
    """The values of a sequence, or of a mapping in sorted key order (as grain); the keys."""
    if isinstance(structure, Mapping):
        keys = sorted(structure)
        return [structure[k] for k in keys], keys
    return list(structure), None


class _MixedDatasetIterator(DatasetIterator):
    """Takes element ``k`` from the iterator ``select_one(k)`` picks; stops at any end."""

    def __init__(self, parents: list, keys: Optional[list], container: type, proportions: Sequence[int]):
        super().__init__(parents)
        self._keys = keys
        self._container = container
        self._proportions = tuple(proportions)
        self._index = 0
        self._stop = False

    def __next__(self):
        if self._stop:
            # Once any input ended, stop even if others still have elements.
            raise StopIteration
        which, _ = select_one(self._index, self._proportions)
        self._index += 1
        try:
            return next(self._parents[which])
        except Exception as e:
            self._stop = True
            name = repr(self._keys[which]) if self._keys is not None else which
            add_note(e, f"grainlike: in {self}, reading dataset {name}")
            raise

    def get_state(self) -> dict:
        states = [p.get_state() for p in self._parents]
        parents = dict(zip(self._keys, states)) if self._keys is not None else self._container(states)
        return {"parents": parents, "index": self._index, "stop": self._stop}

    def set_state(self, state: dict) -> None:
        require_keys(state, self, ("parents", "index", "stop"))
        index = non_negative_int(state, "index", self)
        stop = state["stop"]
        if not isinstance(stop, (bool, np.bool_)):
            raise StateTypeError(f"{self}: state['stop'] must be a bool, got {stop!r}")
        parents_state = state["parents"]
        if self._keys is not None:
            if not isinstance(parents_state, Mapping):
                raise StateTypeError(f"{self}: state['parents'] must map names to states, got {parents_state!r}")
            # Components absent from the state start from the beginning (as grain).
            todo = [(p, parents_state[k]) for k, p in zip(self._keys, self._parents) if parents_state.get(k) is not None]
        else:
            todo = list(zip(self._parents, parent_states(state, self, len(self._parents))))
        set_all_or_none(todo)
        self._index = index
        self._stop = bool(stop)

    def __str__(self) -> str:
        return f"MixedDatasetIterator([{len(self._parents)} parents], proportions={self._proportions})"


class MixedIterDataset(IterDataset):
    """Mixes IterDatasets by weights; stops when any of them ends.

    Args:
      parents: a sequence of datasets, or a mapping of names to datasets (a state
        then restores components by name).
      proportions: weights, a sequence or a mapping like ``parents``.
    """

    @property
    def _element_spec(self) -> Any:
        # The mixed datasets are assumed to share one element spec (as grain).
        return get_element_spec(self._parents[0])

    def __init__(
        self,
        parents: Union[Sequence[IterDataset], Mapping[str, IterDataset]],
        proportions: Union[Sequence[float], Mapping[str, float], None] = None,
    ):
        flat, keys = _flat(parents)
        super().__init__(flat)
        self._keys = keys
        self._container = tuple if isinstance(parents, tuple) else list
        # Unlike a MapDataset's, the default weights are scaled too: [100, 100, ...],
        # which mix as ones do and are what grain prints.
        weights = [1] * len(flat) if proportions is None else _flat(proportions)[0]
        self._proportions = int_proportions(weights, len(flat))

    def __iter__(self) -> DatasetIterator:
        iterators = [p.__iter__() for p in self._parents]
        return _MixedDatasetIterator(iterators, self._keys, self._container, self._proportions)

    def __str__(self) -> str:
        return f"MixedIterDataset([{len(self._parents)} parents], proportions={self._proportions})"
