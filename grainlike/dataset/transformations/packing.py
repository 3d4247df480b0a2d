"""Packing variable-length sequences into fixed-length bins (grain's first fit, best fit).

``num_packing_bins`` bins are filled in the order elements arrive; the first
element that fits no bin closes the batch of bins, which are emitted one by one
(shuffled with ``shuffle_bins``), and starts the next one.

Each packed element holds, for every packed feature ``k``, ``k`` (the values,
padded), ``k_segment_ids`` (1, 2, ... for the elements in the bin, 0 for
padding) and ``k_positions`` (position within each original element), both
int32. Meta features are packed without segment ids and positions when they are
in ``length_struct``; otherwise each bin holds the list of their values.

The state is grain's: the parent's state before the first element of the batch
being emitted, the row reached and a count of emitted rows (which seeds the
shuffle of each batch). A restore re-reads and re-packs that batch.
"""

from __future__ import annotations

import functools
import numbers
from typing import Any, Optional, Sequence

import numpy as np

from grainlike.core import tree
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.nodes.state import non_negative_int, require_keys

__all__ = ["BestFitPackIterDataset", "FirstFitPackIterDataset", "PackIterDataset", "get_non_sequence_meta_features"]

_FIRST_FIT = "first_fit"
_BEST_FIT = "best_fit"


def _is_length(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def sequence_length(value: Any) -> int:
    """The length of a packed feature's value: its first axis, 1 for a scalar."""
    if type(value) is np.ndarray:
        return value.shape[0] if value.ndim else 1
    return 1 if np.ndim(value) == 0 else len(value)


def get_non_sequence_meta_features(length_struct: Any, meta_features: Sequence[str]) -> list[str]:
    """The meta features not in ``length_struct``, in ``meta_features``' order (grain's name).

    Each packed element holds, under their name, the list of their values in its bin.

    Example:
      >>> get_non_sequence_meta_features({"tokens": 8, "doc_id": 8}, ["doc_id", "source"])
      ['source']
    """
    keys = {path[0] for path, _ in tree.flatten_with_key_path(length_struct) if path}
    return [k for k in meta_features if k not in keys]


class _Layout:
    """What is packed where: each leaf's capacity, alignment and padding, from the arguments.

    A feature (a top-level key of ``length_struct``) is one length (a "flat"
    feature, one leaf) or, for a meta feature, a nested structure of lengths.
    """

    def __init__(
        self,
        length_struct: Any,
        meta_features: Sequence[str],
        pack_alignment_struct: Any,
        padding_struct: Any,
    ):
        if not isinstance(length_struct, dict):
            raise ValueError(
                "length_struct must be a dict from feature name to target length (a "
                f"structure of lengths for a meta feature), got {length_struct!r}"
            )
        self.length_struct = length_struct
        self.meta = frozenset(meta_features)
        self.keys = list(length_struct)
        self.flat: list[bool] = []
        self.caps: list[int] = []
        self.aligns: list[int] = []
        self.paddings: list[Any] = []
        self.leaf_counts: list[int] = []
        for key in self.keys:
            lengths = length_struct[key]
            flat = _is_length(lengths)
            if not flat and key not in self.meta:
                # grain's message (its tests match it), then why.
                raise ValueError(
                    f"Failed to extract segment ids for '{key}', which has type {type(lengths)} "
                    "rather than np.ndarray. Perhaps it should be marked as a meta feature? "
                    f"(length_struct[{key!r}] = {lengths!r} is not one length: a nested "
                    "structure of lengths is packed only for a meta feature.)"
                )
            self.flat.append(flat)
            caps = [lengths] if flat else tree.flatten(lengths)
            for cap in caps:
                if not _is_length(cap):
                    raise ValueError(
                        f"length_struct[{key!r}] must hold ints (target lengths), got {cap!r}"
                    )
            self.caps.extend(int(c) for c in caps)
            self.leaf_counts.append(len(caps))
            self.aligns.extend(self._per_leaf(pack_alignment_struct, key, flat, 1, "pack_alignment_struct"))
            self.paddings.extend(self._per_leaf(padding_struct, key, flat, None, "padding_struct"))
        # Meta features outside length_struct: each bin holds the list of their values.
        self.list_meta = get_non_sequence_meta_features(length_struct, meta_features)
        self.caps_array = np.asarray(self.caps, dtype=np.int64)
        self.num_leaves = len(self.caps)
        self.all_flat = all(self.flat)
        # Packing fills `leaf` i of an element from `self.keys[owner[i]]`.
        self.owner = [i for i, n in enumerate(self.leaf_counts) for _ in range(n)]

    def _per_leaf(self, struct: Any, key: Any, flat: bool, default: Any, name: str) -> list:
        if struct is None:
            return [default] * (1 if flat else len(tree.flatten(self.length_struct[key])))
        if not isinstance(struct, dict) or key not in struct:
            raise ValueError(f"{name} must have the structure of length_struct; it lacks {key!r}: {struct!r}")
        value = struct[key]
        if flat:
            return [value]
        return tree.flatten(tree.map_structure(lambda _, v: v, self.length_struct[key], value))

    def leaves(self, element: Any) -> list:
        """The packed leaves of ``element``, in ``self.caps`` order."""
        if self.all_flat:
            out = [element[k] for k in self.keys]
            for value in out:
                if type(value) is not np.ndarray and isinstance(value, (dict, list, tuple)):
                    raise ValueError(
                        f"A packed feature must be an array or a scalar, got {type(value).__name__} "
                        f"{value!r:.100} in an element of structure {tree.shape_spec(element)!r}"
                    )
            return out
        out = []
        for key, flat in zip(self.keys, self.flat):
            if flat:
                out.append(element[key])
            else:
                out.extend(tree.flatten(tree.map_structure(lambda _, v: v, self.length_struct[key], element[key])))
        return out


class _Bins:
    """``num_packing_bins`` bins being filled: values, segment ids, positions."""

    def __init__(
        self,
        layout: _Layout,
        leaves: list,
        num_bins: int,
        max_sequences_per_bin: Optional[int],
        strategy: str,
    ):
        self.layout = layout
        self.num_bins = num_bins
        self.max_per_bin = max_sequences_per_bin
        self.best_fit = strategy == _BEST_FIT
        self.values = []
        self.segment_ids = []
        self.positions = []
        self.size_bytes = 0
        for value, cap, padding, owner in zip(leaves, layout.caps, layout.paddings, layout.owner):
            if np.ndim(value) == 0:
                shape: tuple = ()
                dtype = np.int64 if isinstance(value, int) else np.asarray(value).dtype
            else:
                if not isinstance(value, np.ndarray):
                    raise TypeError(
                        f"Feature {layout.keys[owner]!r} must be a numpy array or a scalar, "
                        f"got {type(value).__name__}"
                    )
                shape, dtype = value.shape[1:], value.dtype
            full_shape = (num_bins, cap, *shape)
            buffer = np.zeros(full_shape, dtype) if padding is None else np.full(full_shape, padding, dtype)
            self.values.append(buffer)
            self.size_bytes += buffer.nbytes
            meta = layout.keys[owner] in layout.meta
            self.segment_ids.append(None if meta else np.zeros((num_bins, cap), np.int32))
            self.positions.append(None if meta else np.zeros((num_bins, cap), np.int32))
            # grain allocates segment ids and positions for meta features too.
            self.size_bytes += 2 * num_bins * cap * 4
        # Next free cell per leaf (rows) and bin (columns).
        self.free = np.zeros((layout.num_leaves, num_bins), np.int64)
        self.size_bytes += self.free.nbytes
        self.counts = np.zeros(num_bins, np.int32)
        self.list_meta = {k: [[] for _ in range(num_bins)] for k in layout.list_meta}
        self.arange = np.arange(max(layout.caps, default=0), dtype=np.int32)

    def try_add(self, element: Any, leaves: list) -> bool:
        """Adds the element to a bin; False if no bin has room."""
        layout = self.layout
        lengths = [sequence_length(v) for v in leaves]
        for n, cap in zip(lengths, layout.caps):
            if n > cap:
                details = [
                    (layout.keys[layout.owner[i]], n, c)
                    for i, (n, c) in enumerate(zip(lengths, layout.caps))
                    if n > c
                ]
                raise ValueError(
                    "Inputs to PackedBatch must be truncated to max length. "
                    f"Exceeds: (feature, feature_length, max_length) = {details}"
                )
        row = self._best_fit_row(lengths) if self.best_fit else self._first_fit_row(lengths)
        if row < 0:
            return False
        self._add(element, leaves, lengths, row)
        return True

    def _first_fit_row(self, lengths: list) -> int:
        if self.layout.num_leaves == 1:
            fits = self.free[0] <= self.layout.caps[0] - lengths[0]
        else:
            fits = (self.free <= (self.layout.caps_array - lengths)[:, None]).all(axis=0)
        if self.max_per_bin is not None:
            fits &= self.counts < self.max_per_bin
        row = int(fits.argmax())
        return row if fits[row] else -1

    def _best_fit_row(self, lengths: list) -> int:
        if self.layout.num_leaves == 1:
            free, cap = self.free[0], self.layout.caps[0]
            new_free = free + lengths[0]
            if self.max_per_bin is not None:
                # A full bin gets one more capacity of length, as grain marks it.
                new_free += np.where(self.counts < self.max_per_bin, 0, cap)
            fits = new_free <= cap
        else:
            caps = self.layout.caps_array[:, None]
            new_free = self.free + np.asarray(lengths, np.int64)[:, None]
            if self.max_per_bin is not None:
                new_free += np.where(self.counts < self.max_per_bin, 0, 1) * caps
            fits = (new_free <= caps).all(axis=0)
            free = self.free.sum(axis=0)
        # The fullest bin that fits (the first of equals); free cells are never negative.
        row = int(np.where(fits, free, -1).argmax())
        return row if fits[row] else -1

    def _add(self, element: Any, leaves: list, lengths: list, row: int) -> None:
        segment_id = self.counts[row] + 1
        free = self.free
        for i, value in enumerate(leaves):
            start = int(free[i, row])
            end = start + lengths[i]
            self.values[i][row, start:end] = value
            segment_ids = self.segment_ids[i]
            if segment_ids is not None:
                segment_ids[row, start:end] = segment_id
                self.positions[i][row, start:end] = self.arange[: end - start]
            align = self.layout.aligns[i]
            free[i, row] = end if align == 1 else -(-end // align) * align
        self.counts[row] += 1
        for key, per_bin in self.list_meta.items():
            per_bin[row].append(element[key])

    def packed(self) -> dict:
        """The packed batch: leading axis the bins that hold any element."""
        layout = self.layout
        n = int(np.count_nonzero(self.counts > 0))
        out: dict = {}
        leaf = 0
        for key, flat, count in zip(layout.keys, layout.flat, layout.leaf_counts):
            values = [v[:n] for v in self.values[leaf : leaf + count]]
            if flat:
                out[key] = values[0]
                if key in layout.meta:
                    leaf += count
                    continue
                out[f"{key}_segment_ids"] = self.segment_ids[leaf][:n]
                out[f"{key}_positions"] = self.positions[leaf][:n]
            else:
                out[key] = tree.unflatten_as(layout.length_struct[key], values)
            leaf += count
        for key, per_bin in self.list_meta.items():
            column = np.empty(n, dtype=object)
            for i in range(n):
                column[i] = per_bin[i]
            out[key] = column
        # grain's packed elements come out of a JAX tree map: keys sorted.
        return {k: out[k] for k in sorted(out)}


class PackingDatasetIterator(DatasetIterator):
    """Fills a batch of bins, then emits its rows one by one; see the module docstring."""

    def __init__(
        self,
        parent: DatasetIterator,
        *,
        strategy: str,
        num_packing_bins: int,
        length_struct: Any,
        seed: int,
        shuffle_bins: bool,
        shuffle_bins_group_by_feature: Optional[str],
        meta_features: Sequence[str],
        pack_alignment_struct: Any = None,
        padding_struct: Any = None,
        max_sequences_per_bin: Optional[int] = None,
        name: str = "FirstFitPackIterDataset",
    ):
        super().__init__(parent)
        self._strategy = strategy
        self._num_bins = num_packing_bins
        self._length_struct = length_struct
        self._seed = seed
        self._shuffle_bins = shuffle_bins
        self._group_by = shuffle_bins_group_by_feature
        self._max_per_bin = max_sequences_per_bin
        self._name = name
        # Built at the first element: a bad length_struct fails there, as in grain.
        self._make_layout = functools.partial(
            _Layout, length_struct, tuple(meta_features), pack_alignment_struct, padding_struct
        )
        self._layout: Optional[_Layout] = None
        self._reset()

    def _reset(self) -> None:
        self._bins: Optional[_Bins] = None  # Being filled.
        # The parent's state to restore to re-pack the batch being emitted.
        self._emitted_batch_parent_state = self._parent.get_state()
        # The parent's state before the first element of the batch being filled.
        self._filling_parent_state: Any = None
        self._rows: Optional[list] = None  # The packed batch being emitted, row by row.
        self._order: Any = None
        self._num_rows = 0
        self._next_row = 0
        self._counter = 0
        self._size_bytes: Optional[int] = None

    def _get_layout(self) -> _Layout:
        if self._layout is None:
            self._layout = self._make_layout()
        return self._layout

    def get_state(self) -> dict:
        return {
            "parent": self._emitted_batch_parent_state,
            "next_row": self._next_row,
            "counter": self._counter,
        }

    def set_state(self, state: dict) -> None:
        require_keys(state, self, ("parent", "next_row", "counter"))
        next_row = non_negative_int(state, "next_row", self, upper=self._num_bins)
        counter = non_negative_int(state, "counter", self)
        self._parent.set_state(state["parent"])
        self._reset()
        self._next_row = next_row
        self._counter = counter

    def get_packed_batch_size_bytes(self) -> int:
        """Bytes of one batch of bins (values, segment ids, positions, free cells).

        Raises:
          ValueError: no element was packed yet.
        """
        if self._size_bytes is None:
            raise ValueError(
                "No current batch. Size can only be computed after at least one element has been packed."
            )
        return self._size_bytes

    def _new_bins(self, leaves: list) -> _Bins:
        return _Bins(self._get_layout(), leaves, self._num_bins, self._max_per_bin, self._strategy)

    def _emit_packed(self, bins: _Bins) -> None:
        """Makes ``bins`` the batch being emitted, in shuffled order if asked."""
        packed = bins.packed()
        self._num_rows = n = max(len(v) for v in packed.values())
        self._rows = list(packed.items()) if self._get_layout().all_flat else packed
        if self._shuffle_bins:
            seed = self._seed + self._counter - self._next_row
            order = np.random.default_rng(seed).permuted(range(n))
            if self._group_by is not None:
                with np.errstate(divide="ignore", invalid="ignore"):
                    averages = []
                    for row in packed[self._group_by]:
                        groups = np.unique(row)
                        averages.append(np.nan_to_num(np.sum(groups) / np.count_nonzero(groups), nan=0.0))
                order = [t[2] for t in sorted((averages[i], order[i], i) for i in range(n))]
            self._order = order
        else:
            self._order = None

    def _row(self) -> Any:
        row = self._next_row if self._order is None else self._order[self._next_row]
        rows = self._rows
        if type(rows) is list:
            return {k: v[row] for k, v in rows}
        return tree.map_structure(lambda x: x[row], rows)

    def __next__(self) -> dict:
        self._assert_not_closed()
        if self._rows is None:
            self._fill()
        element = self._row()
        self._next_row += 1
        self._counter += 1
        if self._next_row >= self._num_rows:
            self._rows = None
            self._order = None
            self._emitted_batch_parent_state = self._filling_parent_state
            self._filling_parent_state = None
            self._next_row = 0
        return element

    def _fill(self) -> None:
        """Reads from the parent until a batch of bins is full (or the parent ends)."""
        parent = self._parent
        while True:
            before = parent.get_state()
            try:
                element = next(parent)
            except StopIteration:
                if self._bins is None:
                    raise
                bins, self._bins = self._bins, None
                self._filling_parent_state = before
                self._emit_packed(bins)
                return
            layout = self._get_layout()
            # Features outside length_struct and meta_features are dropped; a missing
            # one is a KeyError, as in grain.
            for key in layout.list_meta:
                element[key]
            leaves = layout.leaves(element)
            if self._bins is None:
                self._bins = self._new_bins(leaves)
                self._size_bytes = self._bins.size_bytes
            if self._bins.try_add(element, leaves):
                continue
            bins, self._bins = self._bins, self._new_bins(leaves)
            self._filling_parent_state = before
            self._emit_packed(bins)
            if not self._bins.try_add(element, leaves):
                shapes = [np.shape(v) for v in leaves]
                raise ValueError(
                    "Could not add element to empty packed batch! Packed batch has packing "
                    f"sequence lengths: {self._length_struct} while element has shapes {shapes}"
                )
            return

    def __str__(self) -> str:
        return f"{self._name}Iterator(length_struct={self._length_struct}, num_packing_bins={self._num_bins})"


class PackIterDataset(IterDataset):
    """The base of the packing datasets (grain's); its subclasses fix the strategy and document the arguments."""

    _strategy = _FIRST_FIT

    def __init__(
        self,
        parent: IterDataset,
        *,
        length_struct: Any,
        num_packing_bins: int,
        seed: int = 0,
        shuffle_bins: bool = True,
        shuffle_bins_group_by_feature: Optional[str] = None,
        meta_features: Sequence[str] = (),
        pack_alignment_struct: Any = None,
        padding_struct: Any = None,
        max_sequences_per_bin: Optional[int] = None,
    ):
        super().__init__(parent)
        if max_sequences_per_bin is not None and max_sequences_per_bin <= 0:
            raise ValueError(
                "If specified, `max_sequences_per_bin` must be a positive integer, but got "
                f"{max_sequences_per_bin}."
            )
        self._options = dict(
            length_struct=length_struct,
            num_packing_bins=num_packing_bins,
            seed=seed,
            shuffle_bins=shuffle_bins,
            shuffle_bins_group_by_feature=shuffle_bins_group_by_feature,
            meta_features=meta_features,
            pack_alignment_struct=pack_alignment_struct,
            padding_struct=padding_struct,
            max_sequences_per_bin=max_sequences_per_bin,
        )

    def __iter__(self) -> PackingDatasetIterator:
        return PackingDatasetIterator(
            self._parent.__iter__(), strategy=self._strategy, name=type(self).__name__, **self._options
        )

    def __str__(self) -> str:
        return type(self).__name__


class FirstFitPackIterDataset(PackIterDataset):
    """Packs each element into the first bin with room for all its features.

    Args:
      parent: elements are dicts of arrays (first axis the sequence) or scalars.
      length_struct: target length per feature, ``{"tokens": 1024, ...}``.
      num_packing_bins: bins filled at once; more bins, less padding.
      seed: seeds the shuffle of each batch of bins.
      shuffle_bins: emit the bins of each batch in a shuffled order.
      shuffle_bins_group_by_feature: order the bins by the mean of the distinct
        non-zero values of this feature, the shuffle breaking ties.
      meta_features: packed without segment ids and positions if in
        ``length_struct``; otherwise each bin holds the list of their values.
      pack_alignment_struct: per feature, round each element's end up to a
        multiple of this.
      padding_struct: per feature, the value of unfilled cells (default 0).
      max_sequences_per_bin: at most this many elements per bin.

    Example:
      >>> import numpy as np
      >>> from grainlike.dataset import MapDataset
      >>> ds = MapDataset.source([{"t": np.arange(n) + 1} for n in (3, 2, 4)]).to_iter_dataset()
      >>> packed = FirstFitPackIterDataset(ds, length_struct={"t": 5}, num_packing_bins=2, shuffle_bins=False)
      >>> [p["t"].tolist() for p in packed]
      [[1, 2, 3, 1, 2], [1, 2, 3, 4, 0]]
    """

    _strategy = _FIRST_FIT


class BestFitPackIterDataset(PackIterDataset):
    """Packs each element into the fullest bin it fits in (the tightest fit).

    Arguments as ``FirstFitPackIterDataset``.

    Example:
      >>> import numpy as np
      >>> from grainlike.dataset import MapDataset
      >>> ds = MapDataset.source([{"t": np.arange(n) + 1} for n in (3, 4, 1)]).to_iter_dataset()
      >>> packed = BestFitPackIterDataset(ds, length_struct={"t": 5}, num_packing_bins=2, shuffle_bins=False)
      >>> [p["t"].tolist() for p in packed]
      [[1, 2, 3, 0, 0], [1, 2, 3, 4, 1]]
    """

    _strategy = _BEST_FIT
