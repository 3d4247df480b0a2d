"""``full_reference_data``: a function mapped over every record exactly once inside jitted code (JaxSGMC's).

The data comes in through ordered host callbacks (``grainlike.jax.host_callbacks``),
``cache_size`` batches at a time, so the compiled program holds no data.
Importing this module costs numpy only.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, NamedTuple, Optional, Sequence

from grainlike.core.errors import check_int
from grainlike.core.samplers import IndexSampler
from grainlike.core.sharding import NoSharding
from grainlike.core.transforms import Batch
from grainlike.jax.host_callbacks import CallbackErrors, host_callback
from grainlike.jax.jit_batches import (
    MiniBatchInformation,
    _as_source,
    _batched_loader,
    _check_feed_arguments,
    _device_specs,
    _find_batch,
    _read_cache,
)
from grainlike.loader.data_loader import DataLoader

__all__ = ["FullDataState", "FullReferenceData", "full_data_mapper", "full_reference_data"]


class FullDataState(NamedTuple):
    """State of ``FullReferenceData.map`` (JaxSGMC's ``data_state``).

    Attributes:
      passes: passes made so far (int32 scalar).
      ok: bool scalar, False once a pass could not read all its batches (a
        failing transform or source, ...): that pass saw zero batches with an
        all-False mask from the failure on.
    """

    passes: Any
    ok: Any = True


class FullReferenceData:
    """Maps a function over every record exactly once, inside jitted code.

    Build one with ``full_reference_data(...)``. ``map`` runs a ``lax.scan`` over
    the ``ceil(n / batch_size)`` batches of one pass (the last padded with zeros
    and masked). A callback that fails turns the returned state's ``ok`` False;
    its exception is raised by ``host_errors`` around the call or by the next
    ``init`` / ``map`` (called eagerly, by ``map`` itself).
    """

    def __init__(self, loader: DataLoader, cache_size: int, observation_count: int):
        self._loader = loader
        self._cache_size = check_int("cache_size", cache_size, 1)
        self._count = int(observation_count)
        self._num_batches = len(loader)
        self._lock = threading.Lock()
        self._iterator: Any = None
        self._next_fill = 0
        self._specs: Any = None
        self._batch_size = _find_batch(loader.operations, "full_reference_data").batch_size
        self._errors = CallbackErrors("full reference data")

    @property
    def num_batches(self) -> int:
        """Batches in one pass."""
        return self._num_batches

    def _read(self, fill: int) -> tuple:
        """Batches ``fill * cache_size ...`` of a pass: (cache, mask)."""
        if fill == 0 or self._iterator is None or fill != self._next_fill:
            self._close_pass()
            self._iterator = iter(self._loader)
            for _ in range(fill * self._cache_size):  # only after an interrupted pass
                next(self._iterator)
        out = _read_cache(self._iterator, self._cache_size, True, None, "full reference data")
        if out is None:
            raise EOFError(f"full reference data: the pass ended before fill {fill}")
        self._next_fill = fill + 1
        if self._next_fill * self._cache_size >= self._num_batches:
            self._close_pass()  # the pass is complete: its workers stop now
        return out[:2]

    def _specs_of(self) -> Any:
        with self._lock:
            if self._specs is None:
                self._specs = tuple(_device_specs(x) for x in self._read(0))
                self._close_pass()
            return self._specs

    def _host_fill(self, fill: Any) -> tuple:
        with self._lock:
            return self._read(int(fill))  # the callback casts to the specs

    def init(self) -> FullDataState:
        """The initial state of ``map`` (JaxSGMC's ``init_fn()``)."""
        import jax.numpy as jnp

        self._errors.raise_pending()
        self._specs_of()
        return FullDataState(passes=jnp.int32(0), ok=jnp.bool_(True))

    def map(self, fun: Callable[..., tuple], state: FullDataState, carry: Any,
            masking: bool = False, information: bool = False) -> tuple:
        """Maps ``fun`` over all the data: ``(state, (results, carry))``.

        Args:
          fun: ``fun(batch, carry) -> (result, carry)``; with ``masking=True``,
            ``fun(batch, mask, carry) -> (result, carry)`` with ``mask`` True for
            real observations. With ``information=True`` ``batch`` is
            ``(batch, MiniBatchInformation)``. Padding observations are zeros.
          state: from ``init()`` or a previous ``map``.
          carry: carried from batch to batch.
          masking: False: ``fun`` returns one result per observation (leading axis
            ``batch_size``) and ``results`` holds one per record, padding dropped;
            True: ``fun`` returns one result per batch and ``results`` stacks them.
          information: pass ``MiniBatchInformation`` with each batch.

        Returns ``(state, (results, carry))``; ``state.ok`` is False when the
        pass could not read all its batches.
        """
        import jax
        import jax.numpy as jnp

        self._errors.raise_pending()
        cache_spec, mask_spec = self._specs_of()
        size, batch_size = self._cache_size, self._batch_size

        def fill(i: Any, ok: Any) -> tuple:
            filled, (cache, masks) = host_callback(self._errors, self._host_fill, (cache_spec, mask_spec),
                                                   i // size)
            return cache, masks, ok & filled

        def body(c: tuple, i: Any) -> tuple:
            cache, masks, ok, user_carry = c
            line = i % size
            cache, masks, ok = jax.lax.cond(
                line == 0,
                lambda: fill(i, ok),
                lambda: (cache, masks, ok),
            )
            batch, mask = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, line, keepdims=False), (cache, masks))
            if information:
                batch = (batch, MiniBatchInformation(self._count, mask, batch_size))
            result, user_carry = fun(batch, mask, user_carry) if masking else fun(batch, user_carry)
            return (cache, masks, ok, user_carry), result

        empty = (jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache_spec),
                 jnp.zeros(mask_spec.shape, mask_spec.dtype), jnp.bool_(True))
        (_, _, ok, carry), results = jax.lax.scan(
            body, empty + (carry,), jnp.arange(self._num_batches, dtype=jnp.int32)
        )
        if not masking:
            results = jax.tree.map(
                lambda r: r.reshape((-1,) + r.shape[2:])[: self._count], results
            )
        self._errors.check(ok)
        return FullDataState(passes=state.passes + 1, ok=jnp.asarray(state.ok, jnp.bool_) & ok), (results, carry)

    def _close_pass(self) -> None:
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None

    def release(self) -> None:
        """Closes the loader iterator of the last pass; forgets an exception no one raised."""
        self._errors.clear()
        with self._lock:
            self._close_pass()


def full_reference_data(data: Any, cache_size: int = 100, batch_size: Optional[int] = None, *,
                        operations: Sequence[Any] = (), worker_count: int = 0) -> FullReferenceData:
    """Every record exactly once, in masked batches, inside jitted code (JaxSGMC's).

    Args:
      data: a random-access source, or a DataLoader whose last operation is a
        ``Batch(batch_size, pad=True)`` and that reads each record once.
      cache_size: batches per host visit.
      batch_size: observations per batch (for a source).
      operations: per-record maps before batching (for a source; no filter).
      worker_count: worker processes (for a source). With workers the records
        come in the workers' round-robin order, each still exactly once.

    Returns:
      A ``FullReferenceData``: ``init()``, ``map(fun, state, carry, masking=...)``.

    Example (JaxSGMC's):
      full = grain.full_reference_data({"base": np.arange(10)}, cache_size=3, batch_size=4)
      state, (batch_sums, _) = full.map(lambda b, m, c: (jnp.sum(m * b["base"] ** 2), c),
                                        full.init(), None, masking=True)
    """
    checked = _check_feed_arguments("full_reference_data", data, batch_size, operations, worker_count)
    if isinstance(data, DataLoader):
        if not checked.pad or not isinstance(data.operations[-1], Batch):
            raise ValueError("full_reference_data(loader): the last operation must be Batch(..., pad=True)")
        return FullReferenceData(data, cache_size, len(data.sampler))
    source = _as_source(data)
    sampler = IndexSampler(len(source), NoSharding(), shuffle=False, num_epochs=1)
    loader = _batched_loader(source, sampler, operations, checked, True, worker_count)
    return FullReferenceData(loader, cache_size, len(source))


def full_data_mapper(data: Any, cache_size: int = 100, batch_size: Optional[int] = None,
                     **kwargs: Any) -> tuple:
    """JaxSGMC's ``full_data_mapper``: ``(mapper_fn, release)`` without a data state.

    ``mapper_fn(fun, carry, masking=False, information=False) -> (results, carry)``.
    """
    full = full_reference_data(data, cache_size, batch_size, **kwargs)

    def mapper_fn(fun: Callable[..., tuple], carry: Any, masking: bool = False,
                  information: bool = False) -> tuple:
        _, out = full.map(fun, full.init(), carry, masking=masking, information=information)
        return out

    return mapper_fn, full.release
