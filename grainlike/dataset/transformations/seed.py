"""Nodes that configure the stages around them: ``ds.seed(seed)`` and ``WithOptionsIterDataset``."""

from __future__ import annotations

from typing import Any, Sequence

from grainlike.dataset.nodes.element_spec import parent_element_spec
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.nodes.map_dataset import MapDataset


class _WithSeed:
    """The parent's elements unchanged; holds the seed for ``_default_seed``."""

    _element_spec = parent_element_spec

    def __init__(self, parent: Any, *, seed: int):
        super().__init__(parent)
        self._seed_rng_seed = seed


class WithSeedMapDataset(_WithSeed, MapDataset):
    def _own_work_waits(self) -> bool:
        return False  # it only passes elements on

    def __len__(self) -> int:
        return len(self._parent)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        return self._parent[index]

    def _getitems(self, indices: Sequence[int]) -> Sequence:
        return self._parent._getitems(indices)

    def __str__(self) -> str:
        return "WithOptionsMapDataset"


class WithSeedIterDataset(_WithSeed, IterDataset):
    def __iter__(self) -> DatasetIterator:
        return self._parent.__iter__()

    def __str__(self) -> str:
        return "WithOptionsIterDataset"


class WithOptionsIterDataset(IterDataset):
    """Sets ``DatasetOptions`` for the whole pipeline, before and after this node.

    Options set several times are merged; the one set last (downstream) wins.
    """

    _element_spec = parent_element_spec

    def __init__(self, parent: IterDataset, options: Any):
        super().__init__(parent)
        self.options = options

    def __iter__(self) -> DatasetIterator:
        it = self._parent.__iter__()
        it._ctx.dataset_options = self.options.merge(it._ctx.dataset_options)
        return it

    def __str__(self) -> str:
        return f"WithOptionsIterDataset(options={self.options})"
