"""``evaluate``: a full pass over a data source, every record exactly once, reduced over the real records.

Batches are padded (``Batch(batch_size, pad=True)``) so that every batch has the
same shape (one compilation) and the mask drops the padding. Called while JAX
traces, the pass is part of the traced program, fed by ``full_reference_data``'s
host callbacks. jax is imported inside ``evaluate``; workers import this module without jax.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from grainlike.core import sharding as sharding_lib
from grainlike.core.errors import check_int
from grainlike.core.sampling import PaddedEpochSampler
from grainlike.core.transforms import Batch, MapWithIndexTransform, is_batch
from grainlike.loader.data_loader import DataLoader
from grainlike.dataset.nodes.options import ReadOptions

__all__ = ["evaluate"]

_REDUCTIONS = ("mean", "sum", "concat")


class _WithIndex(MapWithIndexTransform):
    """Wraps each element as ``{"index": global index, "element": element}``."""

    def map_with_index(self, index: int, element: Any) -> Any:
        return {"index": np.int64(index), "element": element}


def evaluate(
    fn: Callable[[Any], Any],
    data_source: Any,
    operations: Sequence[Any] = (),
    *,
    batch_size: int,
    reduce: Union[str, Callable[[Any], Any]] = "mean",
    worker_count: int = 0,
    shard_options: sharding_lib.ShardOptions = sharding_lib.NoSharding(),
    seed: int = 0,
    read_options: Optional[ReadOptions] = None,
    sharding: Any = None,
    prefetch: int = 2,
) -> Any:
    """Applies ``fn`` to every record of ``data_source`` once and reduces the results.

    Args:
      fn: a function of one batch (the elements after ``operations``, stacked,
        ``batch_size`` rows, without the mask) returning a pytree of per-record
        results, each with leading axis ``batch_size``. It is jitted here (a
        jitted ``fn`` is fine too) and compiled once: every batch, the last
        included, has the same shapes; padding rows are all zeros.
      data_source: random-access source (``len`` and ``[key]``).
      operations: per-record transforms (Map, RandomMap, MapWithIndex); no Batch
        and no filter is needed, a FilterTransform simply leaves records out.
      batch_size: records per batch.
      reduce: over the real records of this shard: ``"mean"`` (default, e.g.
        accuracy from per-record 0/1), ``"sum"``, ``"concat"`` (every per-record
        result, in record order, as numpy arrays with leading axis = number of
        records), or a callable applied to the ``"concat"`` result.
      worker_count: worker processes that read and transform records.
      shard_options: this process's shard. Each JAX process evaluates its own
        records and runs as many batches as every other (the largest shard sets
        the count; the others get all-masked padding), so ``fn`` may use
        collectives. Combine shards with ``"sum"`` and a per-record count leaf.
      seed: seed of the per-record rngs of random transforms.
      read_options: read-ahead threads and buffer per process.
      sharding: where batches go (see ``DeviceIterator``); None is the default device.
      prefetch: batches put on the device ahead of use.

    Returns:
      The reduced pytree, as numpy arrays.

    Raises:
      ValueError: a Batch in operations, a bad batch_size or reduce, or an ``fn``
        result without leading axis ``batch_size``.
      Exception: what the source or a transform raised; inside a trace, on
        leaving ``grainlike.host_errors()`` around the jitted call instead.

    Example:
      def correct(batch):
          return jnp.argmax(model.apply(params, batch["image"]), -1) == batch["label"]
      accuracy = evaluate(correct, test_source, [Normalize()], batch_size=256, worker_count=2)
    """
    import jax
    import jax.numpy as jnp

    from grainlike.jax.device_iterator import DeviceIterator

    operations = list(operations)
    for i, op in enumerate(operations):
        if is_batch(op):
            raise ValueError(
                f"operations[{i}] is a Batch; evaluate batches by itself (with padding "
                "and a mask), pass batch_size= instead"
            )
    check_int("batch_size", batch_size, 1)
    if not callable(reduce) and reduce not in _REDUCTIONS:
        raise ValueError(f"reduce must be one of {_REDUCTIONS} or a callable, got {reduce!r}")
    # Pads this shard's records up to whole batches of every worker, with the
    # largest shard setting the count: each JAX process runs as many steps.
    sampler = PaddedEpochSampler(
        len(data_source), batch_size, worker_count=worker_count,
        shard_options=shard_options, num_epochs=1, seed=seed,
    )
    loader = DataLoader(
        data_source=data_source,
        sampler=sampler,
        operations=operations + [_WithIndex(), Batch(batch_size, pad=True)],
        worker_count=worker_count,
        shard_options=shard_options,
        read_options=read_options,
    )

    # fn's results are JAX pytrees (traced arrays, possibly nodes registered with
    # JAX), so they are walked with jax.tree rather than grainlike.core.tree.
    def per_record(element: Any) -> Any:
        out = fn(element)
        for leaf in jax.tree.leaves(out):
            if jnp.ndim(leaf) == 0 or jnp.shape(leaf)[0] != batch_size:
                raise ValueError(
                    f"evaluate: fn must return per-record results with leading axis "
                    f"batch_size={batch_size}, got a leaf of shape {jnp.shape(leaf)}"
                )
        return out

    def masked_sums(element: Any, mask: Any) -> Any:
        def total(leaf: Any) -> Any:
            m = mask.reshape(mask.shape + (1,) * (jnp.ndim(leaf) - 1))
            return jnp.sum(jnp.where(m, leaf, jnp.zeros_like(leaf)), axis=0)

        return jax.tree.map(total, per_record(element)), jnp.sum(mask, dtype=jnp.int32)

    if isinstance(jnp.zeros(()), jax.core.Tracer):
        # Inside a trace: the computation is staged, the data fed by callbacks.
        return _evaluate_traced(loader, per_record, masked_sums, reduce, len(data_source))

    masked_sums_jit = jax.jit(masked_sums)
    per_record_jit = jax.jit(per_record)
    accumulate = reduce in ("mean", "sum")
    acc = None
    parts: list = []
    indices: list = []
    with DeviceIterator(iter(loader), sharding, prefetch=prefetch) as batches:
        for batch in batches:
            element, mask = batch["element"], batch["mask"]
            if accumulate:
                sums = masked_sums_jit(element, mask)
                acc = sums if acc is None else jax.tree.map(jnp.add, acc, sums)
            else:
                out = jax.device_get(per_record_jit(element))
                keep = np.asarray(mask)
                parts.append(jax.tree.map(lambda x: np.asarray(x)[keep], out))
                indices.append(np.asarray(batch["index"])[keep])
    if accumulate:
        if acc is None:
            raise ValueError("evaluate: the data source produced no records")
        sums, count = jax.device_get(acc)
        return sums if reduce == "sum" else jax.tree.map(lambda s: np.asarray(s) / count, sums)
    if not parts:
        raise ValueError("evaluate: the data source produced no records")
    order = np.argsort(np.concatenate(indices), kind="stable")
    results = jax.tree.map(lambda *xs: np.concatenate(xs)[order], *parts)
    return results if reduce == "concat" else reduce(results)


def _evaluate_traced(loader: DataLoader, per_record: Callable[[Any], Any],
                     masked_sums: Callable[[Any, Any], Any], reduce: Any, num_records: int) -> Any:
    """``evaluate`` inside a JAX trace: one pass fed by host callbacks, reduced in JAX."""
    import jax
    import jax.numpy as jnp

    from grainlike.jax.full_data import FullReferenceData

    full = FullReferenceData(loader, cache_size=min(len(loader), 16), observation_count=num_records)
    state = full.init()
    if reduce in ("mean", "sum"):
        def add(batch: Any, mask: Any, acc: Any) -> tuple:
            return None, jax.tree.map(jnp.add, acc, masked_sums(batch["element"], mask))

        # The sums of a zero batch set the accumulator's structure.
        cache_spec, mask_spec = full._specs_of()
        one = lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype)  # noqa: E731
        zero = jax.eval_shape(masked_sums, jax.tree.map(one, cache_spec)["element"], one(mask_spec))
        acc0 = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zero)
        _, (_, (sums, count)) = full.map(add, state, acc0, masking=True)
        return sums if reduce == "sum" else jax.tree.map(lambda x: x / count, sums)

    def results(batch: Any, mask: Any, carry: Any) -> tuple:
        return (per_record(batch["element"]), batch["index"], mask), carry

    _, ((out, index, mask), _) = full.map(results, state, None, masking=True)
    flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
    index, mask = flat(index), flat(mask)
    # Real records in record order; the padding sorts last and is cut off.
    order = jnp.argsort(jnp.where(mask, index, jnp.iinfo(index.dtype).max))[:num_records]
    concat = jax.tree.map(lambda x: flat(x)[order], out)
    return concat if reduce == "concat" else reduce(concat)
