"""What the in-jit feeds share: argument and batch checks, stacked and masked caches, specs.

``MiniBatchInformation`` is JaxSGMC's description of a batch; ``ArraysSource``
reads a dict of equally long arrays as a source (JaxSGMC's numpy loaders). jax is
imported where a function needs it.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, Iterator, NamedTuple, Optional, Sequence

import numpy as np

from grainlike.core import tree
from grainlike.core.errors import check_int
from grainlike.core.sharding import NoSharding
from grainlike.core.transforms import Batch, FilterTransform
from grainlike.loader.data_loader import DataLoader
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


def _numeric(batch: Any, where: str) -> Any:
    def check(path: str, leaf: Any) -> np.ndarray:
        leaf = np.asarray(leaf)
        if leaf.dtype.kind not in tree.DEVICE_KINDS:
            # The top-level key is what TfDataSource's exclude_keys (JaxSGMC's) takes.
            key = path[2:path.index("']")] if path.startswith("['") else None
            fix = (
                f"drop it where the data is read: TfDataSource(dataset, exclude_keys=[{key!r}]) for a "
                f"tf.data pipeline, or a MapTransform that removes key {key!r} from each record"
                if key is not None
                else "drop string/object leaves with a MapTransform"
            )
            raise TypeError(
                f"{where}: batches must hold numeric leaves only, got dtype {leaf.dtype} "
                f"at {path or 'the batch'}; {fix}"
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


def _check_feed_arguments(where: str, data: Any, batch_size: Any, operations: Sequence[Any],
                          worker_count: int) -> Any:
    """A DataLoader's one ``Batch``, or for a source the checked ``batch_size``."""
    if isinstance(data, DataLoader):
        if batch_size is not None or operations or worker_count:
            raise ValueError(
                f"{where}(loader): batch_size, operations and worker_count come from "
                "the DataLoader; leave them out"
            )
        return _find_batch(data.operations, where)
    if batch_size is None:
        raise ValueError(f"{where}(source, ...): pass batch_size=")
    batch_size = check_int("batch_size", batch_size, 1)
    if any(isinstance(op, (Batch, FilterTransform)) for op in operations):
        raise ValueError(f"{where}: operations must be per-record maps (no Batch, no filter)")
    return batch_size


def _batched_loader(source: Any, sampler: Any, operations: Sequence[Any], batch_size: int, pad: bool,
                    worker_count: int) -> DataLoader:
    return DataLoader(data_source=source, sampler=sampler,
                      operations=list(operations) + [Batch(batch_size, pad=pad)],
                      worker_count=worker_count, shard_options=NoSharding())


def _read_cache(iterator: Iterator[Any], count: int, padded: bool, size: Optional[int],
                where: str) -> Optional[tuple]:
    """Up to ``count`` batches stacked and padded to ``count``: ``(cache, mask, available)``; None at the end.

    A batch shorter than ``size`` (None: the first batch's size), a loader's last, is padded and masked.
    """
    batches, masks = [], []
    for batch in itertools.islice(iterator, count):
        mask = None
        if padded and isinstance(batch, dict) and set(batch) == {"data", "mask"}:
            batch, mask = batch["data"], batch["mask"]
        elif padded:  # a padded Batch put its mask in the batch
            batch, mask = {k: v for k, v in batch.items() if k != "mask"}, batch["mask"]
        batches.append(batch)
        masks.append(mask)
    if not batches:
        return None
    available = len(batches)
    leading = [int(np.shape(tree.flatten(b)[0])[0]) for b in batches]
    size = size or leading[0]
    for i, short in enumerate(leading):
        if short < size:
            batches[i] = tree.map_structure(
                lambda x: np.concatenate([x, np.zeros((size - short,) + np.shape(x)[1:], np.asarray(x).dtype)]),
                batches[i],
            )
            mask = np.zeros(size, bool)
            mask[:short] = True if masks[i] is None else np.asarray(masks[i], bool)
            masks[i] = mask
    for _ in range(count - available):
        batches.append(tree.zeros_like(batches[0]))
        masks.append(np.zeros(size, bool))
    mask = np.stack([np.ones(size, bool) if m is None else np.asarray(m, bool) for m in masks])
    return _numeric(tree.stack(batches), where), mask, np.int32(available)


def _device_specs(host_tree: Any) -> Any:
    """ShapeDtypeStructs (canonical dtypes) of a pytree of numpy arrays, as a JAX pytree."""
    import jax

    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), jax.dtypes.canonicalize_dtype(np.asarray(x).dtype)),
        host_tree,
    )


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
    """A dict of arrays, or a finite ``tf.data.Dataset`` / ``TfDataSource`` of dicts, as an ``ArraysSource``.

    A ``tf.data.Dataset`` is read once (``TfDataSource``); anything else is a source already.
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
