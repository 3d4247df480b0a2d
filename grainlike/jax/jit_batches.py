"""What reference data and full data share: batch checks, masks, specs, ``ArraysSource``.

``MiniBatchInformation`` is JaxSGMC's description of a batch; ``ArraysSource``
reads a dict of equally long arrays as a source (JaxSGMC's numpy loaders). The
rest checks a loader's batches (numeric leaves, one ``Batch``) and describes them
to JAX. jax is imported where a function needs it.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple, Sequence

import numpy as np

from grainlike.core import tree
from grainlike.core.transforms import Batch
from grainlike.sources.tf_data import TfDataSource, is_tf_dataset

__all__ = ["ArraysSource", "MiniBatchInformation"]


class MiniBatchInformation(NamedTuple):
    """What ``next`` tells about a batch (JaxSGMC's fields).

    Attributes:
      observation_count: records in the data source (one shard's, when sharded).
      mask: bool ``(batch_size,)``, True for real observations, False for padding.
      batch_size: observations per batch.
    """

    observation_count: Any
    mask: Any
    batch_size: Any


def _split_mask(batch: Any, padded: bool) -> tuple:
    """``(data, mask)`` of a batch; a padded Batch put its mask in the batch."""
    if not padded:
        return batch, None
    if isinstance(batch, dict) and set(batch) == {"data", "mask"}:
        return batch["data"], batch["mask"]
    data = {k: v for k, v in batch.items() if k != "mask"}
    return data, batch["mask"]


def _numeric(batch: Any, where: str) -> Any:
    def check(path: str, leaf: Any) -> np.ndarray:
        leaf = np.asarray(leaf)
        if leaf.dtype.kind not in tree.DEVICE_KINDS:
            raise TypeError(
                f"{where}: batches must hold numeric leaves only, got dtype {leaf.dtype} "
                f"at {path or 'the batch'}; drop string/object leaves with a MapTransform"
            )
        return leaf

    return tree.map_structure_with_path(check, batch)


def _find_batch(operations: Sequence[Any], where: str) -> Batch:
    batches = [op for op in operations if isinstance(op, Batch)]
    if len(batches) != 1:
        raise ValueError(
            f"{where}: the loader must have exactly one Batch among its operations, "
            f"got {len(batches)}"
        )
    return batches[0]


def _leading(batch: Any) -> int:
    """The leading (batch) size of a batch's first leaf."""
    return int(np.shape(tree.flatten(batch)[0])[0])


def _device_specs(host_tree: Any) -> Any:
    """ShapeDtypeStructs (canonical dtypes) of a pytree of numpy arrays, as a JAX pytree."""
    import jax

    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), jax.dtypes.canonicalize_dtype(np.asarray(x).dtype)),
        host_tree,
    )


def _cast(host_tree: Any, specs: Any) -> Any:
    import jax

    return jax.tree.map(lambda x, s: np.asarray(x, dtype=s.dtype), host_tree, specs)


class ArraysSource:
    """A dict of equally long arrays as a source of per-observation dicts (JaxSGMC's loaders).

    Example:
      >>> s = ArraysSource({"x": np.arange(3), "y": np.zeros((3, 2))})
      >>> len(s), int(s[1]["x"])
      (3, 1)
    """

    def __init__(self, arrays: dict):
        if not isinstance(arrays, dict) or not arrays:
            raise TypeError(f"ArraysSource takes a non-empty dict of arrays, got {type(arrays).__name__}")
        self._arrays = {k: np.asarray(v) for k, v in arrays.items()}
        lengths = {k: len(v) for k, v in self._arrays.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"ArraysSource: the arrays differ in length: {lengths}")
        self._len = next(iter(lengths.values()))

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, key: int) -> dict:
        return {k: v[key] for k, v in self._arrays.items()}

    def __getitems__(self, keys: Sequence[int]) -> list:
        keys = np.asarray(keys)
        columns = {k: v[keys] for k, v in self._arrays.items()}
        return [{k: c[i] for k, c in columns.items()} for i in range(len(keys))]

    def __repr__(self) -> str:
        shapes = {k: v.shape for k, v in self._arrays.items()}
        return f"ArraysSource({json.dumps({k: list(s) for k, s in shapes.items()})})"


def _as_source(data: Any) -> Any:
    """A dict of arrays becomes an ``ArraysSource``; anything else is a source already.

    A finite ``tf.data.Dataset`` is read once (``TfDataSource``); dict elements, from
    it or from a ``TfDataSource``, are then read as an ``ArraysSource`` (numpy
    gathers, no DataLoader).
    """
    if is_tf_dataset(data):
        data = TfDataSource(data)
    if isinstance(data, TfDataSource) and isinstance(data.columns, dict) and all(
        isinstance(c, np.ndarray) for c in data.columns.values()
    ):
        return ArraysSource(data.columns)
    if isinstance(data, dict):
        return ArraysSource(data)
    return data
