"""Shapes and dtypes of a loader's batches, for initialising a model before training.

``element_spec(loader)`` runs the loader's pipeline in the calling process until it
produces one output (the first batch of worker 0; no worker process starts,
whatever the loader's ``worker_count``) and describes it as a pytree of
``jax.ShapeDtypeStruct``. ``zeros_batch(loader)`` is an all-zero batch of the same
structure, shapes and dtypes. With ``Batch(..., pad=True)`` every batch has this
structure, including the last, so one compiled step fits all.

jax is imported inside ``element_spec``; ``zeros_batch`` needs numpy only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from grainlike.core import tree
from grainlike.loader.options import ReadOptions

__all__ = ["element_spec", "first_output", "zeros_batch"]

# Numeric kinds a device holds: bool, signed, unsigned, float, complex.
_DEVICE_KINDS = frozenset("biufc")


def first_output(loader: Any) -> Any:
    """The loader's first output of worker 0, computed in the calling process.

    Uses the loader's source, sampler, operations and sharding; reads without
    read-ahead threads, and starts no worker process.

    Raises:
      ValueError: the pipeline produces no output (e.g. a filter drops every record).
    """
    options = ReadOptions(num_threads=0, prefetch_buffer_size=loader.read_options.prefetch_buffer_size)
    it = loader._worker_dataset(0, options).__iter__()
    try:
        for output in it:
            return output
    finally:
        it.close()
    raise ValueError(
        f"the loader produced no output to describe (sampler {loader.sampler!r}, "
        f"{len(loader.operations)} operations): every record was filtered out or "
        "worker 0 has no records"
    )


def element_spec(loader: Any, *, sharding: Any = None) -> Any:
    """The structure, shapes and dtypes of the loader's batches.

    Args:
      loader: a ``DataLoader``.
      sharding: optional ``jax.sharding.Sharding`` to put in every spec (for
        ``jax.jit(...).lower(spec)`` of a sharded step).

    Returns:
      The batch's pytree (dicts, tuples, lists, namedtuples) with each numeric leaf
      replaced by ``jax.ShapeDtypeStruct(shape, dtype)`` and each non-numeric
      leaf (strings, objects: they never reach a device) by ``None``.

    Example:
      spec = element_spec(loader)          # {"image": ShapeDtypeStruct((32, 28, 28), float32), ...}
      params = model.init(key, zeros_batch(loader)["image"])
    """
    import jax

    def spec(x: np.ndarray) -> Any:
        if x.dtype.kind not in _DEVICE_KINDS:
            return None
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    return tree.map_structure(lambda x: spec(np.asarray(x)), first_output(loader))


def zeros_batch(loader: Any) -> Any:
    """An all-zero batch of the loader's structure, shapes and dtypes (numpy).

    Non-numeric leaves are zero-valued too (empty strings). See ``element_spec``.
    """
    return tree.zeros_like(first_output(loader))
