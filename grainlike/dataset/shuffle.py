"""Global shuffle of a MapDataset: a keyed permutation of each epoch, new in each epoch."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from grainlike.core.index_shuffle import index_shuffle
from grainlike.dataset.base import MapDataset


class ShuffleMapDataset(MapDataset):
    """Element ``i`` of epoch ``e`` is the parent's element ``p(i) + e * len``.

    ``p`` is grain's ``index_shuffle`` (4 rounds) keyed by ``(seed + e) mod 2**32``,
    so each epoch is shuffled differently and the same seed gives grain's order.

    Raises:
      ValueError: no seed (neither given nor derived from ``ds.seed()``), or a seed
        outside ``[0, 2**32)``.
    """

    def __init__(self, parent: MapDataset, *, seed: Optional[int] = None):
        super().__init__(parent)
        seed = self._default_seed if seed is None else seed
        if seed is None:
            raise ValueError("`shuffle` requires a seed. Please provide it with `ds.seed(seed)`")
        if seed < 0 or seed >= 2**32:
            raise ValueError(f"Seed must be an integer between 0 and 2**32-1 (got {seed=}).")
        self._seed = int(seed)

    def __len__(self) -> int:
        return len(self._parent)

    def __str__(self) -> str:
        return "ShuffleMapDataset"

    def _epoch_seed(self, epoch: int) -> int:
        return (self._seed + epoch) % 2**32

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        n = len(self._parent)
        epoch, in_epoch = divmod(index, n)
        return self._parent[index_shuffle(in_epoch, n - 1, self._epoch_seed(epoch), 4) + epoch * n]

    def _getitems(self, indices: Sequence[int]) -> Sequence:
        n = len(self._parent)
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size == 0:
            return self._parent._getitems([])
        if n == 0:
            raise ZeroDivisionError(f"{self}: cannot read index {idx[0]} of an empty dataset")
        epochs, in_epoch = np.divmod(idx, n)
        first, last = int(epochs.min()), int(epochs.max())
        if first == last:  # The common case: a chunk within one epoch.
            out = index_shuffle(in_epoch, n - 1, self._epoch_seed(first), 4) + first * n
        else:
            out = np.empty_like(idx)
            for epoch in np.unique(epochs).tolist():
                at = epochs == epoch
                out[at] = index_shuffle(in_epoch[at], n - 1, self._epoch_seed(epoch), 4) + epoch * n
        return self._parent._getitems(out.tolist())
