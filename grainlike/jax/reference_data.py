"""``reference_data``: chains of batches for ``jax.jit``, ``lax.scan`` and ``lax.while_loop`` (JaxSGMC's).

A chain's state holds a device-side cache of ``cache_size`` batches, refilled by
one ordered host callback (``grainlike.jax.host_callbacks``) once every cached
batch has been used, the next fill read ahead in a background thread. Modes
(JaxSGMC's): draws with replacement, shuffling without replacement reshuffled
every epoch, and epochs padded to whole batches with a mask. Importing this
module costs numpy only.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
import weakref
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np

from grainlike.core.errors import check_int, is_int
from grainlike.core.read_ahead import ERROR, Prefetcher
from grainlike.core.sampling import PaddedEpochSampler, RandomSampler
from grainlike.core.samplers import IndexSampler
from grainlike.core.sharding import NoSharding
from grainlike.core.transforms import Batch
from grainlike.jax.host_callbacks import CallbackErrors, host_callback
from grainlike.jax.jit_batches import (
    ArraysSource,
    MiniBatchInformation,
    _as_source,
    _batched_loader,
    _check_feed_arguments,
    _device_specs,
    _numeric,
    _read_cache,
)
from grainlike.loader.data_loader import DataLoader

__all__ = ["CacheState", "ReferenceData", "reference_data"]

# Fill states kept per chain: a state up to this many fills old can still be
# continued, saved or replayed.
_KEPT_FILLS = 16


class CacheState(NamedTuple):
    """A chain's position and its device-side cache (a JAX pytree; carry it through loops).

    Attributes:
      chain: the chain's id (int32 scalar).
      fill: how many times the cache has been refilled (int32 scalar).
      line: the next cache line ``next`` returns (int32 scalar).
      available: cache lines holding data (``cache_size`` until the data ends).
      cache: the cached batches, leading axis ``cache_size``.
      mask: bool ``(cache_size, batch_size)``, False for padding observations.
      ok: bool scalar, False once a refill failed (the end of the data, a failing
        transform, ...): from then on ``next`` returns zero batches with an
        all-False mask and the position stays after the last batch delivered.
    """

    chain: Any
    fill: Any
    line: Any
    available: Any
    cache: Any
    mask: Any
    ok: Any = True


class _Ahead:
    """One fill read in a background thread while the device works through the cache."""

    def __init__(self, fill: int, read: Callable[[], Any]):
        self.fill = fill
        self._thread = Prefetcher((read() for _ in range(1)), None, None, 1, owner="reference data",
                                  name=f"grainlike-reference-data-fill-{fill}")
        # A chain dropped before taking this fill: the thread ends and lets go of it.
        weakref.finalize(self, self._thread.stop, False)

    def result(self) -> Any:
        kind, value, _ = self._thread.get()
        self.wait()
        if kind is ERROR:  # handed to the callback that takes this fill
            raise value
        return value

    def wait(self) -> None:
        self._thread.stop()


@dataclasses.dataclass
class _Chain:
    reader: Any
    config: dict
    next_fill: int = 0
    fill_states: dict = dataclasses.field(default_factory=dict)
    ahead: Optional[_Ahead] = None


class ReferenceData:
    """Chains of batches for jitted code: ``init``, ``next``, ``get_state``, ``restore``.

    Build one with ``reference_data(...)``. Each ``init()`` starts an independent
    chain (its own loader iterator); its state is a ``CacheState`` to carry
    through ``jit`` / ``lax.scan`` / ``lax.while_loop``. ``next`` visits the host
    once per ``cache_size`` batches and returns every batch of the chain, in
    order. Not usable under ``vmap`` (ordered callbacks are not batched): give
    each chain its own state. A refill that fails turns the state's ``ok`` False;
    its exception is raised by ``host_errors`` around the call or by the next
    ``init`` / ``next`` / ``get_state`` / ``restore``, and until then no chain of
    this reference data reads data.
    """

    def __init__(self, make_reader: Callable[[dict], Any], cache_size: int,
                 observation_count: int, default_config: dict):
        self._make_reader = make_reader
        self._cache_size = check_int("cache_size", cache_size, 1)
        self._observation_count = int(observation_count)
        self._default_config = dict(default_config)
        self._chains: dict[int, _Chain] = {}
        self._ids = itertools.count()
        self._lock = threading.RLock()
        self._specs: Any = None  # (cache, mask) specs, fixed by the first chain
        self._batch_size: Optional[int] = None
        self._errors = CallbackErrors("reference data")

    @property
    def cache_size(self) -> int:
        return self._cache_size

    def _read_fill(self, chain: _Chain, fill: int) -> tuple:
        """Fill number ``fill`` of ``chain``: (cache, mask, available); reads the next one ahead."""
        ahead, chain.ahead = chain.ahead, None
        if ahead is not None and ahead.fill == fill:
            out = ahead.result()
        else:
            if ahead is not None:
                ahead.wait()  # it moved the reader; repositioned below
                chain.next_fill = ahead.fill + 1
            if fill != chain.next_fill:
                state = chain.fill_states.get(fill)
                if state is None:
                    raise ValueError(
                        f"reference data: chain state at fill {fill} is too old to continue "
                        f"(the chain is at fill {chain.next_fill}; the last {_KEPT_FILLS} fills "
                        "are kept); save it with get_state() and restore() it instead"
                    )
                chain.reader.set_state(state)
            chain.fill_states[fill] = chain.reader.get_state()
            out = chain.reader.read(self._cache_size, self._batch_size)
        chain.next_fill = fill + 1
        for old in [k for k in chain.fill_states if k <= fill - _KEPT_FILLS]:
            del chain.fill_states[old]
        if out is not None:
            # The state before the next fill is known now; the reading itself overlaps
            # with the device working through this fill.
            chain.fill_states[fill + 1] = chain.reader.get_state()
            size, batch_size, reader = self._cache_size, self._batch_size, chain.reader
            chain.ahead = _Ahead(fill + 1, lambda: reader.read(size, batch_size))
        if out is None:
            raise EOFError(
                f"reference data: chain {chain.config.get('chain_id')} has no more batches "
                f"(its loader ended); use a repeating mode or fewer steps"
            )
        return out

    def _host_fill(self, chain_id: Any, fill: Any) -> tuple:
        with self._lock:
            chain = self._chains.get(int(chain_id))
            if chain is None:
                raise ValueError(f"reference data: no chain {int(chain_id)} (it was released)")
            return self._read_fill(chain, int(fill))  # the callback casts to the specs

    def _start(self, config: dict, loader_state: Optional[Any], line: int) -> CacheState:
        import jax
        import jax.numpy as jnp

        self._errors.raise_pending()
        reader = self._make_reader(config)
        with self._lock:
            chain_id = next(self._ids)
            config = {**config, "chain_id": chain_id}
            chain = _Chain(reader, config)
            if loader_state is not None:
                chain.reader.set_state(loader_state)
            self._chains[chain_id] = chain
            cache, mask, available = self._read_fill(chain, 0)
            specs = (_device_specs(cache), _device_specs(mask))
            if self._specs is None:
                self._specs = specs
                self._batch_size = int(mask.shape[1])
            elif specs != self._specs:
                raise ValueError(
                    f"reference data: chain {chain_id}'s batches {specs[0]} differ from the "
                    f"first chain's {self._specs[0]}; every chain must have the same shapes"
                )
        if line > int(available):
            raise ValueError(f"checkpoint line {line} is past the {int(available)} batches left")
        return CacheState(
            chain=jnp.int32(chain_id),
            fill=jnp.int32(0),
            line=jnp.int32(line),
            available=jnp.int32(available),
            cache=jax.tree.map(lambda x, s: jnp.asarray(x, s.dtype), cache, self._specs[0]),
            mask=jnp.asarray(mask),
            ok=jnp.bool_(True),
        )

    def init(self, *, seed: Optional[int] = None, shuffle: Optional[bool] = None,
             in_epochs: Optional[bool] = None) -> CacheState:
        """Starts a new chain and returns its state (the first cache already filled).

        Args:
          seed: the chain's seed (draws, permutations and random transforms);
            defaults to the one given to ``reference_data``.
          shuffle: False: independent draws with replacement; True: without
            replacement, reshuffled once every record has been drawn.
          in_epochs: with ``shuffle``, epochs end in a batch padded with masked
            observations instead of running into the next epoch.

        For ``reference_data(loader)`` (a DataLoader given), the loader decides
        and these arguments must be left out.
        """
        config = dict(self._default_config)
        for name, value in (("seed", seed), ("shuffle", shuffle), ("in_epochs", in_epochs)):
            if value is not None:
                if "loader" in config:
                    raise ValueError(
                        f"init({name}=...): this reference data reads a given DataLoader, "
                        "whose sampler sets the order; build the loader with what you need"
                    )
                config[name] = value
        if config.get("in_epochs") and not config.get("shuffle"):
            raise ValueError("init(in_epochs=True) needs shuffle=True (epochs without replacement)")
        return self._start(config, None, 0)

    def next(self, state: CacheState, information: bool = True) -> tuple:
        """The chain's next batch: ``(state, batch, info)`` (``(state, batch)`` without info).

        Call inside jitted code (or eagerly). Refills the cache, with one ordered
        host callback, when every cached batch has been used.

        A refill that fails (EOFError when the chain's loader has ended, or what
        the loader raised) turns the state's ``ok`` False and gives zero
        batches with an all-False ``info.mask``; called eagerly it raises here.
        """
        import jax
        import jax.numpy as jnp

        self._errors.raise_pending()
        if self._specs is None:
            raise RuntimeError("reference data: call init() before next()")
        cache_spec, mask_spec = self._specs
        result_specs = (cache_spec, mask_spec, jax.ShapeDtypeStruct((), jnp.int32))

        def refill(s: CacheState) -> CacheState:
            fill = s.fill + 1
            ok, (cache, mask, available) = host_callback(self._errors, self._host_fill, result_specs,
                                                         s.chain, fill)
            # A failed refill keeps the position after the last batch delivered.
            return CacheState(s.chain, jnp.where(ok, fill, s.fill), jnp.where(ok, 0, s.line),
                              jnp.where(ok, available, s.available), cache, mask, ok)

        state = state._replace(ok=jnp.asarray(state.ok, jnp.bool_))
        state = jax.lax.cond(state.ok & (state.line >= state.available), refill, lambda s: s, state)
        line = state.line
        batch, mask = jax.tree.map(lambda c: jax.lax.dynamic_index_in_dim(c, line, keepdims=False),
                                   (state.cache, state.mask))
        state = state._replace(line=jnp.where(state.ok, line + 1, line))
        self._errors.check(state.ok)
        if not information:
            return state, batch
        info = MiniBatchInformation(
            observation_count=self._observation_count, mask=mask, batch_size=self._batch_size
        )
        return state, batch, info

    def get_state(self, state: CacheState) -> dict:
        """A JSON-able checkpoint of the chain at ``state`` (after its last ``next``).

        Call it on a finished computation's state (``jax.block_until_ready``).
        A state whose refill failed (``ok`` False) is saved at the last batch it
        delivered.

        Raises:
          Exception: the one a refill caught and no one has raised yet.
        """
        self._errors.raise_pending()
        return self._checkpoint(int(state.chain), int(state.fill), int(state.line))

    def _checkpoint(self, chain_id: int, fill: int, line: int) -> dict:
        """``get_state`` of a position, without raising a pending callback error (io's checkpoints)."""
        with self._lock:
            chain = self._chains.get(chain_id)
            if chain is None:
                raise ValueError(f"reference data: no chain {chain_id} (it was released)")
            loader_state = chain.fill_states.get(fill)
            if loader_state is None:
                raise ValueError(
                    f"reference data: chain {chain_id}'s state at fill {fill} is no longer "
                    f"kept (the chain is at fill {chain.next_fill}); save states right after "
                    "the computation that made them"
                )
            config = {k: v for k, v in chain.config.items() if k not in ("chain_id", "loader")}
        return {"config": config, "loader_state": loader_state, "line": line}

    def restore(self, checkpoint: dict) -> CacheState:
        """A new chain's state that continues exactly where ``checkpoint`` was saved."""
        if not isinstance(checkpoint, dict) or set(checkpoint) != {"config", "loader_state", "line"}:
            raise ValueError(
                "reference data: a checkpoint is the dict get_state() returns, with keys "
                f"config, loader_state, line; got {checkpoint!r:.200}"
            )
        config = {**self._default_config, **checkpoint["config"]}
        return self._start(config, checkpoint["loader_state"], int(checkpoint["line"]))

    def release(self, state: Optional[CacheState] = None) -> None:
        """Closes one chain's loader iterator (``state``'s), or every chain's.

        Releasing every chain also forgets an exception a refill caught and no
        one raised; it raises nothing.
        """
        with self._lock:
            if state is None:
                self._errors.clear()
            ids = list(self._chains) if state is None else [int(state.chain)]
            for chain_id in ids:
                chain = self._chains.pop(chain_id, None)
                if chain is not None:
                    if chain.ahead is not None:
                        chain.ahead.wait()
                    chain.reader.close()

    def __enter__(self) -> "ReferenceData":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class _LoaderReader:
    """A chain's DataLoader iterator, read ``cache_size`` batches at a time."""

    def __init__(self, loader: DataLoader):
        self._padded = any(isinstance(op, Batch) and op.pad for op in loader.operations)
        self._iterator = iter(loader)
        self._size: Optional[int] = None

    def get_state(self) -> str:
        state = self._iterator.get_state()
        return state.decode() if isinstance(state, bytes) else state

    def set_state(self, state: str) -> None:
        self._iterator.set_state(state.encode() if isinstance(state, str) else state)

    def close(self) -> None:
        self._iterator.close()

    def read(self, count: int, batch_size: Optional[int]) -> Optional[tuple]:
        """Up to ``count`` batches stacked, padded to ``count``: (cache, mask, available)."""
        # The first batch sets the size (a loader's batches are full until its last).
        out = _read_cache(self._iterator, count, self._padded, batch_size or self._size, "reference data")
        if out is not None:
            self._size = out[1].shape[1]
        return out


class _GatherReader:
    """A chain over in-memory arrays: the sampler's keys gathered with numpy, no per-record work.

    Yields exactly the batches of ``DataLoader(ArraysSource(arrays), sampler,
    [Batch(batch_size, pad=padded)])``; its state is the next global index.
    """

    def __init__(self, source: "ArraysSource", sampler: Any, batch_size: int):
        self._arrays = source._arrays
        self._sampler = sampler
        self._batch_size = batch_size
        self._position = 0

    def get_state(self) -> str:
        return json.dumps({"position": self._position})

    def set_state(self, state: str) -> None:
        position = json.loads(state).get("position") if isinstance(state, str) else None
        if not is_int(position) or position < 0:
            raise ValueError(f"reference data: not a position of in-memory arrays: {state!r:.200}")
        self._position = position

    def close(self) -> None:
        pass

    def read(self, count: int, batch_size: Optional[int]) -> tuple:
        size = self._batch_size
        indices = np.arange(self._position, self._position + count * size, dtype=np.int64)
        located = self._sampler.locate(indices)
        keys = located.keys
        mask = np.ones(count * size, bool) if located.padding is None else ~np.asarray(located.padding)
        cache = {}
        for name, array in self._arrays.items():
            values = array[keys]
            if not mask.all():
                values[~mask] = 0
            cache[name] = values.reshape((count, size) + array.shape[1:])
        self._position += count * size
        return _numeric(cache, "reference data"), mask.reshape(count, size), np.int32(count)


def _mode_sampler(n: int, batch_size: int, worker_count: int, config: dict) -> tuple:
    """``(sampler, padded)`` of a chain's mode."""
    seed = config.get("seed", 0)
    if not config.get("shuffle"):
        return RandomSampler(n, num_samples=None, seed=seed), False
    if config.get("in_epochs"):
        return PaddedEpochSampler(n, batch_size, worker_count=worker_count, shuffle=True,
                                  num_epochs=None, seed=seed), True
    return IndexSampler(n, NoSharding(), shuffle=True, num_epochs=None, seed=seed), False


def _mode_reader(source: Any, batch_size: int, operations: Sequence[Any], worker_count: int,
                 config: dict) -> Any:
    """A chain's reader: numpy gathers for plain arrays, else the DataLoader of the chain's mode."""
    sampler, padded = _mode_sampler(len(source), batch_size, worker_count, config)
    if isinstance(source, ArraysSource) and not operations and not worker_count:
        return _GatherReader(source, sampler, batch_size)  # the sampler's padding is the mask
    return _LoaderReader(_batched_loader(source, sampler, operations, batch_size, padded, worker_count))


def reference_data(data: Any, cache_size: int = 100, batch_size: Optional[int] = None, *,
                   operations: Sequence[Any] = (), worker_count: int = 0,
                   seed: int = 0) -> ReferenceData:
    """Batches for jitted code from a source (JaxSGMC's modes) or from a DataLoader.

    Args:
      data: a random-access source (``len`` and ``[key]``), read in the mode each
        ``init`` chooses; or a ``DataLoader`` with one ``Batch``, read as it is
        (every chain iterates it from the start; a ``Batch(..., pad=True)``'s mask
        goes to ``info.mask``).
      cache_size: batches per host visit, kept on the device.
      batch_size: observations per batch (for a source; not with a DataLoader).
      operations: per-record transforms applied before batching (for a source).
      worker_count: worker processes per chain (for a source).
      seed: the default seed of ``init``.

    Returns:
      A ``ReferenceData``: ``init``, ``next``, ``get_state``, ``restore``, ``release``.

    Example:
      data = grain.reference_data(source, cache_size=100, batch_size=32)
      state = data.init(shuffle=True)
      state, batch, info = data.next(state)      # inside jit / scan / while_loop
    """
    batch_size = _check_feed_arguments("reference_data", data, batch_size, operations, worker_count)
    if isinstance(data, DataLoader):
        try:
            count = len(data.data_source)
        except TypeError:
            count = -1
        return ReferenceData(lambda config: _LoaderReader(data), cache_size, count, {"loader": True})
    data = _as_source(data)
    count = len(data)
    if batch_size > count:
        raise ValueError(f"batch_size={batch_size} is larger than the {count} records of {data!r:.100}")
    operations = list(operations)
    return ReferenceData(
        lambda config: _mode_reader(data, batch_size, operations, worker_count, config),
        cache_size, count, {"seed": seed, "shuffle": False, "in_epochs": False},
    )
