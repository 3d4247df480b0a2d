"""Shapes and dtypes of a loader's batches, for initialising a model before training.

``element_spec(loader)`` and ``zeros_batch(loader)`` read one element in the
calling process (worker 0's first, after the operations before the loader's
``Batch``; no worker process starts) and build the batch from it with the
loader's own ``Batch`` (its ``batch_fn`` and ``pad``): the *configured* batch, not
whatever the loader happens to yield first. ``batch_size=None`` (default) is the
``Batch``'s size (a loader without ``Batch`` gives one observation); ``n`` sets a
leading axis of ``n`` (JaxSGMC's ``initializer_batch(mb_size)``). The dtypes are
JAX's canonical ones, as the batches have them on the device (without
``jax_enable_x64`` float64 is float32, int64 is int32); where jax is not installed,
``zeros_batch`` keeps the host dtypes.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any, Callable, Optional

import numpy as np

from grainlike.core import tree
from grainlike.core.errors import check_int
from grainlike.core.transforms import Batch, MapTransform, batch_elements
from grainlike.loader import pipeline
from grainlike.dataset.nodes.options import ReadOptions

__all__ = ["element_spec", "first_output", "zeros_batch"]


def _first(loader: Any, operations: list) -> Any:
    """Worker 0's first output of ``operations`` over the loader's records, in process."""
    options = ReadOptions(num_threads=0, prefetch_buffer_size=loader.read_options.prefetch_buffer_size)
    ds = pipeline.records_dataset(
        loader._records,
        operations,
        options,
        worker=(0, loader.worker_count),
    )
    it = ds.__iter__()
    try:
        for output in it:
            return output
    finally:
        it.close()
    raise ValueError(
        f"the loader produced no output to describe (sampler {loader.sampler!r}, "
        f"{len(operations)} operations before the Batch): every record was filtered "
        "out or worker 0 has no records"
    )


def first_output(loader: Any) -> Any:
    """The loader's first output of worker 0, computed in the calling process.

    Uses the loader's source, sampler, operations and sharding; reads without
    read-ahead threads, and starts no worker process.

    Raises:
      ValueError: the pipeline produces no output (e.g. a filter drops every record).
    """
    return _first(loader, list(loader.operations))


def example_batch(loader: Any, batch_size: Optional[int] = None) -> Any:
    """A batch of the loader's structure, shapes and dtypes, from one element (numpy).

    Every row is the loader's first element (worker 0's); see the module docstring
    for ``batch_size``.

    Raises:
      ValueError: a bad ``batch_size``, or no element to describe.
      TypeError: an operation after the ``Batch`` that is not a MapTransform.
    """
    check_int("batch_size", batch_size, 1, none_ok=True)
    operations = list(loader.operations)
    last = max((i for i, op in enumerate(operations) if isinstance(op, Batch)), default=None)
    if last is None:
        element = _first(loader, operations)
        if batch_size is None:
            return element
        return tree.stack([element] * int(batch_size))
    first = min(i for i, op in enumerate(operations) if isinstance(op, Batch))
    op = operations[first]
    element = _first(loader, operations[:first])
    size = op.batch_size if batch_size is None else int(batch_size)
    batch = batch_elements(dataclasses.replace(op, batch_size=size), [element] * size)
    for i, later in enumerate(operations[first + 1:], first + 1):
        if isinstance(later, Batch):
            raise TypeError(
                f"operations[{i}] is a second Batch ({later!r}); describe this loader's "
                "batches with first_output(loader) instead"
            )
        if not isinstance(later, MapTransform):
            raise TypeError(
                f"operations[{i}] ({later!r}) comes after the Batch and is not a "
                "MapTransform; describe this loader's batches with first_output(loader)"
            )
        batch = later.map(batch)
    return batch


def element_spec(loader: Any, batch_size: Optional[int] = None, *, sharding: Any = None) -> Any:
    """The structure, shapes and dtypes of the loader's batches.

    Args:
      loader: a ``DataLoader``.
      batch_size: None for the loader's ``Batch`` size (one observation when it
        has no ``Batch``), or the leading size to describe.
      sharding: optional ``jax.sharding.Sharding`` to put in every spec (for
        ``jax.jit(...).lower(spec)`` of a sharded step).

    Returns:
      The batch's pytree (dicts, tuples, lists, namedtuples) with each numeric leaf
      replaced by ``jax.ShapeDtypeStruct(shape, dtype on the device)`` and each
      non-numeric leaf (strings, objects: they never reach a device) by ``None``.

    Example:
      spec = element_spec(loader)          # {"image": ShapeDtypeStruct((32, 28, 28), float32), ...}
      params = model.init(key, zeros_batch(loader)["image"])
    """
    import jax

    return _described(loader, batch_size, lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding),
                      lambda x: None)


def zeros_batch(loader: Any, batch_size: Optional[int] = None) -> Any:
    """An all-zero batch of the loader's structure, shapes and device dtypes (numpy).

    ``model.init(key, zeros_batch(loader))`` traces the model with the dtypes of
    the batches it will be called with. Non-numeric leaves are zero-valued too
    (empty strings). A padded loader's ``mask`` is all False. See ``element_spec``
    for ``batch_size``.
    """
    return _described(loader, batch_size, np.zeros, np.zeros_like)


def _described(loader: Any, batch_size: Optional[int], numeric: Callable, other: Callable) -> Any:
    """``example_batch`` with each numeric leaf as ``numeric(shape, device dtype)``, each other as ``other(leaf)``."""
    # JAX's canonical dtype, or the host's where jax is not installed. find_spec
    # answers from sys.modules when jax is imported (or blocked by None).
    device_dtype = np.dtype
    if importlib.util.find_spec("jax") is not None:
        import jax

        device_dtype = jax.dtypes.canonicalize_dtype

    def leaf(x: Any) -> Any:
        x = np.asarray(x)
        return numeric(x.shape, device_dtype(x.dtype)) if x.dtype.kind in tree.DEVICE_KINDS else other(x)

    return tree.map_structure(leaf, example_batch(loader, batch_size))
