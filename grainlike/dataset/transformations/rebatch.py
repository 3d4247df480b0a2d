"""``RebatchIterDataset``: batches of another size cut from a stream of batches.

The state is grain's: ``{"parent": the parent's state before the batch being cut,
"batch_idx": the next row of that batch}``.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from grainlike.core import tree
from grainlike.dataset.nodes.element_spec import ShapeDtypeStructProtocol, get_element_spec, map_specs
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.nodes.state import non_negative_int, require_keys


class _RebatchDatasetIterator(DatasetIterator):
    def __init__(self, parent: DatasetIterator, batch_size: int, drop_remainder: bool):
        super().__init__(parent)
        self._batch_size = batch_size
        self._drop_remainder = drop_remainder
        self._leaves: Optional[list] = None  # The leaves of the batch being cut.
        self._structure: Any = None
        self._batch_idx = 0
        self._last_parent_state = self._parent.get_state()

    def get_state(self) -> dict:
        return {"parent": self._last_parent_state, "batch_idx": self._batch_idx}

    def set_state(self, state: dict) -> None:
        require_keys(state, self, ("parent", "batch_idx"))
        batch_idx = non_negative_int(state, "batch_idx", self)
        self._parent.set_state(state["parent"])
        self._last_parent_state = self._parent.get_state()
        self._batch_idx = batch_idx
        self._leaves = None

    def __next__(self):
        self._assert_not_closed()
        needed = self._batch_size
        pieces: list[list] = []
        while needed > 0:
            if self._leaves is None or self._batch_idx >= len(self._leaves[0]):
                # After a restore the batch read first starts at the restored row.
                first = self._leaves is None
                try:
                    self._last_parent_state = self._parent.get_state()
                    element = next(self._parent)
                except StopIteration:
                    if self._drop_remainder:
                        raise
                    break
                if self._structure is None:
                    self._structure = element
                self._leaves = tree.flatten(element)
                if not first:
                    self._batch_idx = 0
            leaves = self._leaves
            rows = len(leaves[0])
            if rows <= 0:
                raise ValueError(
                    f"{self}: rebatching batches with 0 rows is not supported (an empty batch came from the parent)"
                )
            if not pieces:
                pieces = [[] for _ in leaves]
            take = min(needed, rows - self._batch_idx)
            for i, leaf in enumerate(leaves):
                pieces[i].append(leaf[self._batch_idx : self._batch_idx + take])
            self._batch_idx += take
            needed -= take
        if needed == self._batch_size:
            # No rows: the parent ended (also right after a restore to the end of
            # its last batch, where grain returns a batch of 0 rows).
            raise StopIteration
        out = [p[0] if len(p) == 1 else np.concatenate(p, axis=0) for p in pieces]
        return tree.unflatten_as(self._structure, out)

    def __str__(self) -> str:
        return f"RebatchDatasetIterator(batch_size={self._batch_size}, drop_remainder={self._drop_remainder})"


class RebatchIterDataset(IterDataset):
    """Re-cuts the parent's batches into batches of ``batch_size`` rows.

    Every leaf of the parent's elements has the batch on its first axis.

    Example:
      >>> from grainlike.dataset import MapDataset
      >>> ds = MapDataset.range(7).to_iter_dataset().batch(3)
      >>> [b.tolist() for b in RebatchIterDataset(ds, batch_size=2)]
      [[0, 1], [2, 3], [4, 5], [6]]

    Raises:
      ValueError: ``batch_size <= 0``; on iteration, a parent batch with no rows.
    """

    @property
    def _element_spec(self) -> Any:
        # Each leaf's first axis becomes batch_size, as grain says (for a short last batch too).
        def rebatched(x: Any) -> Any:
            if not isinstance(x, ShapeDtypeStructProtocol):
                return x
            return type(x)(shape=(self._batch_size,) + tuple(x.shape[1:]), dtype=x.dtype)

        return map_specs(rebatched, get_element_spec(self._parent))

    def __init__(self, parent: IterDataset, batch_size: int, drop_remainder: bool = False):
        super().__init__(parent)
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}.")
        self._batch_size = batch_size
        self._drop_remainder = drop_remainder

    def __iter__(self) -> DatasetIterator:
        return _RebatchDatasetIterator(self._parent.__iter__(), self._batch_size, self._drop_remainder)

    def __str__(self) -> str:
        return f"RebatchIterDataset(batch_size={self._batch_size}, drop_remainder={self._drop_remainder})"
