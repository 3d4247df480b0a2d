"""A finite ``tf.data.Dataset`` as a random-access source, read once into numpy arrays.

``TfDataSource(dataset)`` runs the pipeline to its end once and keeps each leaf of
the element structure as one stacked numpy array (strings as object arrays of
``bytes``); records are then read by index like any in-memory source, and workers
read them without TensorFlow. What does not fit in memory is read as a stream by
``grainlike.experimental.TfDataIterDataset``. Nothing here imports TensorFlow: it is
loaded already when the user passes a dataset.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from grainlike.core import tree

__all__ = ["TfDataSource", "is_tf_dataset"]

# Elements per tf.data batch when materialising a dataset whose shapes are all known.
_CHUNK = 1024
# The default bound on the arrays a TfDataSource holds (4 GiB).
DEFAULT_MAX_BYTES = 4 << 30
# tf.data.INFINITE_CARDINALITY.
_INFINITE = -1


def is_tf_dataset(x: Any) -> bool:
    """Whether ``x`` is a ``tf.data.Dataset`` (any TF 2 dataset class), without importing TensorFlow.

    ``tf.data.Dataset`` is ``DatasetV2`` (module ``tensorflow.python...``); every
    dataset class, the TF 1 adapters included, derives from it.
    """
    if not type(x).__module__.startswith("tensorflow"):
        return False
    return any(c.__name__ == "DatasetV2" and c.__module__.startswith("tensorflow.") for c in type(x).__mro__)


def _spec_problems(element_spec: Any) -> tuple[list[str], bool]:
    """Leaves that cannot be stacked (ragged, sparse, ...) and whether every shape is known."""
    problems = []
    all_known = True
    for path, spec in tree.flatten_with_path(element_spec):
        kind = type(spec).__name__
        if kind != "TensorSpec":
            problems.append(f"{path or 'the element'} is a {kind}")
        elif not spec.shape.is_fully_defined():
            all_known = False
    return problems, all_known


def _drop_keys(dataset: Any, exclude_keys: Sequence[str]) -> Any:
    """``dataset`` without the top-level keys ``exclude_keys`` (JaxSGMC's ``exclude_keys``)."""
    spec = dataset.element_spec
    if not isinstance(spec, dict):
        raise TypeError(
            f"TfDataSource: exclude_keys={list(exclude_keys)!r} needs dict elements; this dataset's "
            f"elements are {type(spec).__name__}: {spec!r:.200}"
        )
    missing = [k for k in exclude_keys if k not in spec]
    if missing:
        raise KeyError(f"TfDataSource: exclude_keys {missing!r} are not keys of the elements; they have {sorted(spec)!r}")
    drop = set(exclude_keys)
    # Plain Python for tf.data to trace: autograph would convert it through a
    # source file it writes to TMPDIR and never removes.
    keep = sys.modules["tensorflow"].autograph.experimental.do_not_convert(
        lambda element: {k: v for k, v in element.items() if k not in drop}
    )
    return dataset.map(keep)


def _column(leaves: list, is_string: bool) -> np.ndarray:
    """One leaf's values stacked; scalar strings as an object array, so bytes stay exact."""
    if is_string and np.ndim(leaves[0]) == 0:
        out = np.empty(len(leaves), dtype=object)
        out[:] = leaves
        return out
    return np.stack(leaves)


class TfDataSource:
    """A finite ``tf.data.Dataset``, read once into numpy arrays, as a random-access source.

    ``source[i]`` is the ``i``-th element ``dataset.as_numpy_iterator()`` yielded
    when the source was built (the same structure, numpy values, strings as
    ``bytes``). A shuffle inside the pipeline is applied once, at that read;
    shuffle with grainlike's sampler instead (``IndexSampler(shuffle=True)``,
    ``reference_data``'s modes), which reshuffles every epoch and restores exactly.

    Args:
      dataset: a finite ``tf.data.Dataset``.
      exclude_keys: top-level keys of dict elements to drop before reading (JaxSGMC's
        ``exclude_keys``, e.g. a string ``"id"`` that jitted code cannot take).
      max_bytes: the most bytes of arrays to hold (default 4 GiB); ``None`` for no bound.

    Raises:
      TypeError: ``dataset`` is not a ``tf.data.Dataset``, or ``exclude_keys`` with
        elements that are not dicts.
      KeyError: an ``exclude_keys`` key the elements do not have.
      ValueError: the dataset is infinite or empty, a leaf is ragged or sparse, a
        leaf's shape differs between elements (the message names the leaf, the
        element and both shapes), or the arrays would exceed ``max_bytes``.

    Example:
      source = TfDataSource(tf.data.Dataset.from_tensor_slices({"x": xs, "y": ys}))
      loader = grainlike.loader(source).shuffle(0).batch(32).build()
    """

    def __init__(self, dataset: Any, *, exclude_keys: Sequence[str] = (), max_bytes: Optional[int] = DEFAULT_MAX_BYTES):
        if not is_tf_dataset(dataset):
            raise TypeError(f"TfDataSource takes a tf.data.Dataset, got {type(dataset).__name__}: {dataset!r:.100}")
        if isinstance(exclude_keys, str):
            exclude_keys = [exclude_keys]
        if exclude_keys:
            dataset = _drop_keys(dataset, exclude_keys)
        cardinality = int(dataset.cardinality())
        if cardinality == _INFINITE:
            raise ValueError(
                f"TfDataSource: the dataset ({type(dataset).__name__}) is infinite (cardinality() == INFINITE, e.g. after "
                ".repeat()), and a random-access source needs every record: drop the .repeat() (use "
                "the sampler's num_epochs), take a finite part with .take(n), or read it as a stream "
                "with grainlike.experimental.TfDataIterDataset"
            )
        problems, all_known = _spec_problems(dataset.element_spec)
        if problems:
            raise ValueError(
                f"TfDataSource: {'; '.join(problems)}: each leaf must be a dense tensor of one shape "
                "to be stacked into an array. Make it dense in the pipeline (e.g. "
                ".map(lambda e: {**e, 'tokens': e['tokens'].to_tensor()}) padded to a fixed length), "
                "exclude it (exclude_keys=...), or read the elements as they are with "
                "grainlike.experimental.TfDataIterDataset"
            )
        self._element_spec = tree.map_structure(
            lambda s: f"{s.dtype.name}{list(s.shape.as_list())}", dataset.element_spec
        )
        self._columns, self._len = self._read(dataset, all_known, max_bytes)

    def _read(self, dataset: Any, batched: bool, max_bytes: Optional[int]) -> tuple[Any, int]:
        """Runs the pipeline once; returns the stacked tree and the element count."""
        strings = {path for path, s in tree.flatten_with_path(dataset.element_spec) if s.dtype.name == "string"}
        structure: Any = None
        paths: list[str] = []
        parts: list[list] = []  # per leaf: chunks (batched) or elements
        count = 0
        nbytes = 0
        source = dataset.batch(_CHUNK) if batched else dataset
        for element in source.as_numpy_iterator():
            if structure is None:
                structure = element
                paths = [p for p, _ in tree.flatten_with_path(element)]
                parts = [[] for _ in paths]
            leaves = tree.flatten(element)
            for i, leaf in enumerate(leaves):
                if not batched and parts[i] and np.shape(leaf) != np.shape(parts[i][0]):
                    raise ValueError(
                        f"TfDataSource: leaf {paths[i] or '(the element)'} has shape "
                        f"{np.shape(parts[i][0])} in element 0 and {np.shape(leaf)} in element "
                        f"{count}: elements must have one shape per leaf to be stacked. Pad or "
                        "crop them in the pipeline, or read them as they are with "
                        "grainlike.experimental.TfDataIterDataset"
                    )
                parts[i].append(leaf)
            count += len(leaves[0]) if batched else 1
            nbytes += tree.estimate_nbytes(element)
            if max_bytes is not None and nbytes > max_bytes:
                raise ValueError(
                    f"TfDataSource: the first {count} elements already hold {nbytes} bytes, more "
                    f"than max_bytes={max_bytes}: pass a larger max_bytes (or None), or read the "
                    "dataset as a stream with grainlike.experimental.TfDataIterDataset"
                )
        if count == 0:
            raise ValueError(f"TfDataSource: the dataset ({type(dataset).__name__}) has no elements")
        if batched:
            columns = [np.concatenate(p) for p in parts]
        else:
            columns = [_column(p, path in strings) for p, path in zip(parts, paths)]
        for column in columns:
            column.flags.writeable = False  # records are views: a change would reach every later read
        return tree.unflatten_as(structure, columns), count

    @property
    def columns(self) -> Any:
        """The element structure with each leaf an array of all records (read-only)."""
        return self._columns

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, record_key: int) -> Any:
        key = int(record_key)
        if not -self._len <= key < self._len:
            raise IndexError(f"{self!r}: record key {record_key} is outside [0, {self._len})")
        return tree.map_structure(lambda c: c[key], self._columns)

    def __getitems__(self, record_keys: Sequence[int]) -> list:
        keys = np.asarray(record_keys, dtype=np.int64)
        if keys.size and (keys.min() < -self._len or keys.max() >= self._len):
            raise IndexError(f"{self!r}: record keys outside [0, {self._len}) among {keys.tolist()[:8]}")
        gathered = [c[keys] for c in tree.flatten(self._columns)]
        return [tree.unflatten_as(self._columns, [g[i] for g in gathered]) for i in range(len(keys))]

    def __repr__(self) -> str:
        # Identifies the data for checkpoints: no addresses, the same in every process.
        return f"TfDataSource(len={self._len}, element_spec={self._element_spec!r})"
