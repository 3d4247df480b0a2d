"""Data inside ``jax.jit``, ``lax.scan`` and ``lax.while_loop``, in JaxSGMC's functional style.

Two ways to feed jitted loops from a grainlike loader through ordered host callbacks:

- ``reference_data(...)``: a chain of batches. ``init()`` returns a state holding a
  device-side cache of ``cache_size`` batches; ``next(state) -> (state, batch,
  info)`` takes one batch from it and, once every cached batch has been used,
  refills the cache with one ordered ``io_callback``. No batch is ever skipped.
  Modes (JaxSGMC's): independent draws with replacement, shuffling without
  replacement reshuffled every epoch, and epochs padded to whole batches with a
  mask. Several chains, one state each, are independent. ``get_state(state)`` is
  a JSON-able checkpoint of where a chain is; ``restore(checkpoint)`` gives a
  state that draws exactly the batches the saved one would have drawn.
- ``full_reference_data(...)``: maps a function over every record exactly once, in
  batches padded and masked at the end, inside jitted code; the data comes in
  through callbacks, ``cache_size`` batches at a time, so the compiled program
  holds no data.

A Python exception raised by a host callback reaches the caller of a jitted
function as a ``JaxRuntimeError``; inside ``with host_errors():`` (or under the
``@host_errors()`` decorator) it is raised as the original exception, with the
original message. Importing this module costs numpy only; jax is imported when
a feed is used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import threading
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np

from grainlike.core import tree
from grainlike.core.sampling import PaddedEpochSampler, RandomSampler
from grainlike.core.samplers import IndexSampler
from grainlike.core.sharding import NoSharding
from grainlike.core.transforms import Batch, FilterTransform
from grainlike.loader.data_loader import DataLoader

__all__ = [
    "CacheState",
    "FullDataState",
    "MiniBatchInformation",
    "ReferenceData",
    "FullReferenceData",
    "full_data_mapper",
    "full_reference_data",
    "host_errors",
    "reference_data",
]

# Numeric kinds a device holds: bool, signed, unsigned, float, complex.
_DEVICE_KINDS = frozenset("biufc")
# Fill states kept per chain: a state up to this many fills old can still be
# continued, saved or replayed.
_KEPT_FILLS = 16


# -- host errors ------------------------------------------------------------------------


class _Raised:
    """The exceptions grainlike's host callbacks raised, newest last (bounded)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._errors: list = []

    def add(self, error: BaseException) -> None:
        with self._lock:
            self._count += 1
            self._errors = (self._errors + [(self._count, error)])[-32:]

    def mark(self) -> int:
        with self._lock:
            return self._count

    def since(self, mark: int) -> Optional[BaseException]:
        with self._lock:
            found = [e for n, e in self._errors if n > mark]
        return found[-1] if found else None


_RAISED = _Raised()


def reporting(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps a host callback so that ``host_errors`` can re-raise what it raises."""

    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except BaseException as e:
            _RAISED.add(e)
            raise

    return call


class host_errors(contextlib.ContextDecorator):
    """Re-raises a grainlike host callback's exception as itself, not as a JAX runtime error.

    JAX reports an exception raised in a host callback as ``JaxRuntimeError:
    INTERNAL: CpuCallback error ...``. Inside this context (or a function decorated
    with ``@host_errors()``), such an error, when a grainlike callback raised
    during the context, is replaced by that callback's exception (``EOFError`` at
    the end of the data, say), chained to the JAX error. Block on the results
    inside the context: JAX may report the error only when they are used.

    Example:
      with grain.host_errors():
          params = jax.block_until_ready(train(params))   # EOFError at the end of data
    """

    def __enter__(self) -> "host_errors":
        self._mark = _RAISED.mark()
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> bool:
        if value is None or not _is_jax_runtime_error(value):
            return False
        original = _RAISED.since(self._mark)
        if original is None:
            return False
        raise original.with_traceback(original.__traceback__) from value


def _is_jax_runtime_error(error: BaseException) -> bool:
    try:
        import jax
    except ImportError:  # pragma: no cover - jax raised it, so jax is there
        return False
    return isinstance(error, jax.errors.JaxRuntimeError)


# -- shared pieces --------------------------------------------------------------------


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
        if leaf.dtype.kind not in _DEVICE_KINDS:
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


def _check_positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


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


# -- chains of batches ------------------------------------------------------------------


class CacheState(NamedTuple):
    """A chain's position and its device-side cache (a JAX pytree; carry it through loops).

    Attributes:
      chain: the chain's id (int32 scalar).
      fill: how many times the cache has been refilled (int32 scalar).
      line: the next cache line ``next`` returns (int32 scalar).
      available: cache lines holding data (``cache_size`` until the data ends).
      cache: the cached batches, leading axis ``cache_size``.
      mask: bool ``(cache_size, batch_size)``, False for padding observations.
    """

    chain: Any
    fill: Any
    line: Any
    available: Any
    cache: Any
    mask: Any


class _Ahead:
    """One fill read in a background thread while the device works through the cache."""

    def __init__(self, fill: int, read: Callable[[], Any]):
        self.fill = fill
        self._result: Any = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(read,), daemon=True,
                                         name=f"grainlike-reference-data-fill-{fill}")
        self._thread.start()

    def _run(self, read: Callable[[], Any]) -> None:
        try:
            self._result = read()
        except BaseException as e:  # handed to the callback that takes this fill
            self._error = e

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result

    def wait(self) -> None:
        self._thread.join()


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
    once per ``cache_size`` batches (one ordered ``io_callback``), and returns
    every batch of the chain, in order. Not usable under ``vmap`` (ordered
    callbacks are not batched): give each chain its own state.
    """

    def __init__(self, make_reader: Callable[[dict], Any], cache_size: int,
                 observation_count: int, default_config: dict, read_ahead: bool = True):
        self._make_reader = make_reader
        self._read_ahead = read_ahead
        self._cache_size = _check_positive("cache_size", cache_size)
        self._observation_count = int(observation_count)
        self._default_config = dict(default_config)
        self._chains: dict[int, _Chain] = {}
        self._ids = itertools.count()
        self._lock = threading.RLock()
        self._specs: Any = None  # (cache, mask) specs, fixed by the first chain
        self._batch_size: Optional[int] = None

    @property
    def cache_size(self) -> int:
        return self._cache_size

    # -- host side -------------------------------------------------------------

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
        if out is not None and self._read_ahead:
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
            cache, mask, available = self._read_fill(chain, int(fill))
            cache_spec, mask_spec = self._specs
            return _cast(cache, cache_spec), mask, available

    def _start(self, config: dict, loader_state: Optional[Any], line: int) -> CacheState:
        import jax
        import jax.numpy as jnp

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
            cache=jax.tree.map(jnp.asarray, _cast(cache, self._specs[0])),
            mask=jnp.asarray(mask),
        )

    # -- the API -----------------------------------------------------------------

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

        Raises (as a JAX runtime error; see ``host_errors``): EOFError when the
        chain's loader has ended.
        """
        import jax
        import jax.numpy as jnp
        from jax.experimental import io_callback

        if self._specs is None:
            raise RuntimeError("reference data: call init() before next()")
        cache_spec, mask_spec = self._specs
        result_specs = (cache_spec, mask_spec, jax.ShapeDtypeStruct((), jnp.int32))
        fill_fn = reporting(self._host_fill)

        def refill(s: CacheState) -> CacheState:
            fill = s.fill + 1
            cache, mask, available = io_callback(fill_fn, result_specs, s.chain, fill, ordered=True)
            return CacheState(s.chain, fill, jnp.int32(0), available, cache, mask)

        state = jax.lax.cond(state.line >= state.available, refill, lambda s: s, state)
        line = state.line
        batch = jax.tree.map(lambda c: jax.lax.dynamic_index_in_dim(c, line, keepdims=False), state.cache)
        mask = jax.lax.dynamic_index_in_dim(state.mask, line, keepdims=False)
        state = state._replace(line=line + 1)
        if not information:
            return state, batch
        info = MiniBatchInformation(
            observation_count=self._observation_count, mask=mask, batch_size=self._batch_size
        )
        return state, batch, info

    def get_state(self, state: CacheState) -> dict:
        """A JSON-able checkpoint of the chain at ``state`` (after its last ``next``).

        Call it on a finished computation's state (``jax.block_until_ready``).
        """
        chain_id, fill, line = int(state.chain), int(state.fill), int(state.line)
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
        """Closes one chain's loader iterator (``state``'s), or every chain's."""
        with self._lock:
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
        batches, masks = [], []
        for _ in range(count):
            try:
                batch = next(self._iterator)
            except StopIteration:
                break
            data, mask = _split_mask(batch, self._padded)
            batches.append(data)
            masks.append(mask)
        if not batches:
            return None
        available = len(batches)
        # The first batch sets the size (a loader's batches are full until its last).
        size = self._size = batch_size or self._size or _leading(batches[0])
        for i, data in enumerate(batches):
            short = _leading(data)
            if short < size:  # a loader's last, smaller batch: padded and masked
                batches[i] = tree.map_structure(
                    lambda x: np.concatenate([x, np.zeros((size - short,) + np.shape(x)[1:], np.asarray(x).dtype)]),
                    data,
                )
                mask = np.zeros(size, bool)
                mask[:short] = True if masks[i] is None else np.asarray(masks[i], bool)
                masks[i] = mask
        for _ in range(count - available):
            batches.append(tree.zeros_like(batches[0]))
            masks.append(np.zeros(size, bool))
        mask = np.stack([np.ones(size, bool) if m is None else np.asarray(m, bool) for m in masks])
        return _numeric(tree.stack(batches), "reference data"), mask, np.int32(available)


class _GatherReader:
    """A chain over in-memory arrays: the sampler's keys gathered with numpy, no per-record work.

    Yields exactly the batches of ``DataLoader(ArraysSource(arrays), sampler,
    [Batch(batch_size, pad=padded)])``; its state is the next global index.
    """

    def __init__(self, source: "ArraysSource", sampler: Any, batch_size: int, padded: bool):
        self._arrays = source._arrays
        self._sampler = sampler
        self._batch_size = batch_size
        self._padded = padded
        self._position = 0

    def get_state(self) -> str:
        return json.dumps({"position": self._position})

    def set_state(self, state: str) -> None:
        position = json.loads(state).get("position") if isinstance(state, str) else None
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
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


def _mode_loader(source: Any, batch_size: int, operations: Sequence[Any], worker_count: int,
                 config: dict) -> DataLoader:
    """The DataLoader of one chain: its sampler is the chain's mode."""
    sampler, padded = _mode_sampler(len(source), batch_size, worker_count, config)
    return DataLoader(data_source=source, sampler=sampler,
                      operations=list(operations) + [Batch(batch_size, pad=padded)],
                      worker_count=worker_count, shard_options=NoSharding())


def _mode_reader(source: Any, batch_size: int, operations: Sequence[Any], worker_count: int,
                 config: dict) -> Any:
    """A chain's reader: numpy gathers for plain arrays, else the mode's DataLoader."""
    if isinstance(source, ArraysSource) and not operations and not worker_count:
        sampler, padded = _mode_sampler(len(source), batch_size, worker_count, config)
        return _GatherReader(source, sampler, batch_size, padded)
    return _LoaderReader(_mode_loader(source, batch_size, operations, worker_count, config))


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
    if isinstance(data, DataLoader):
        if batch_size is not None or operations or worker_count:
            raise ValueError(
                "reference_data(loader): batch_size, operations and worker_count come from "
                "the DataLoader; leave them out"
            )
        _find_batch(data.operations, "reference_data")
        try:
            count = len(data.data_source)
        except TypeError:
            count = -1
        return ReferenceData(lambda config: _LoaderReader(data), cache_size, count, {"loader": True})
    if batch_size is None:
        raise ValueError("reference_data(source, ...): pass batch_size=")
    batch_size = _check_positive("batch_size", batch_size)
    data = _as_source(data)
    count = len(data)
    if batch_size > count:
        raise ValueError(f"batch_size={batch_size} is larger than the {count} records of {data!r:.100}")
    if any(isinstance(op, (Batch, FilterTransform)) for op in operations):
        raise ValueError("reference_data: operations must be per-record maps (no Batch, no filter)")
    operations = list(operations)
    return ReferenceData(
        lambda config: _mode_reader(data, batch_size, operations, worker_count, config),
        cache_size, count, {"seed": seed, "shuffle": False, "in_epochs": False},
    )


# -- the full data, exactly once --------------------------------------------------------


class FullDataState(NamedTuple):
    """State of ``FullReferenceData.map`` (JaxSGMC's ``data_state``): passes made so far."""

    passes: Any


class FullReferenceData:
    """Maps a function over every record exactly once, inside jitted code.

    Build one with ``full_reference_data(...)``. ``map`` runs a ``lax.scan`` over
    the ``ceil(n / batch_size)`` batches of one pass (the last padded with zeros
    and masked); the batches come from the host through one ordered callback per
    ``cache_size`` batches, so the program holds no data.
    """

    def __init__(self, loader: DataLoader, cache_size: int, observation_count: int):
        self._loader = loader
        self._cache_size = _check_positive("cache_size", cache_size)
        self._count = int(observation_count)
        self._num_batches = len(loader)
        self._lock = threading.Lock()
        self._iterator: Any = None
        self._next_fill = 0
        self._specs: Any = None
        self._batch_size = _find_batch(loader.operations, "full_reference_data").batch_size

    @property
    def num_batches(self) -> int:
        """Batches in one pass."""
        return self._num_batches

    def _read(self, fill: int) -> tuple:
        """Batches ``fill * cache_size ...`` of a pass: (cache, mask)."""
        if fill == 0 or self._iterator is None or fill != self._next_fill:
            if self._iterator is not None:
                self._iterator.close()
            self._iterator = iter(self._loader)
            for _ in range(fill * self._cache_size):  # only after an interrupted pass
                next(self._iterator)
        batches, masks = [], []
        for _ in range(self._cache_size):
            try:
                batch = next(self._iterator)
            except StopIteration:
                break
            data, mask = _split_mask(batch, True)
            batches.append(data)
            masks.append(np.asarray(mask, bool))
        if not batches:
            raise EOFError(f"full reference data: the pass ended before fill {fill}")
        for _ in range(self._cache_size - len(batches)):
            batches.append(tree.zeros_like(batches[0]))
            masks.append(np.zeros_like(masks[0]))
        self._next_fill = fill + 1
        if self._next_fill * self._cache_size >= self._num_batches:
            # The pass is complete: its workers (if any) stop now, not at exit.
            self._iterator.close()
            self._iterator = None
        return _numeric(tree.stack(batches), "full reference data"), np.stack(masks)

    def _specs_of(self) -> Any:
        with self._lock:
            if self._specs is None:
                self._specs = tuple(_device_specs(x) for x in self._read(0))
                if self._iterator is not None:
                    self._iterator.close()
                    self._iterator = None
            return self._specs

    def _host_fill(self, fill: Any) -> tuple:
        with self._lock:
            cache, mask = self._read(int(fill))
            return _cast(cache, self._specs[0]), mask

    def init(self) -> FullDataState:
        """The initial state of ``map`` (JaxSGMC's ``init_fn()``)."""
        import jax.numpy as jnp

        self._specs_of()
        return FullDataState(passes=jnp.int32(0))

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
        """
        import jax
        import jax.numpy as jnp
        from jax.experimental import io_callback

        cache_spec, mask_spec = self._specs_of()
        fill_fn = reporting(self._host_fill)
        size, batch_size = self._cache_size, self._batch_size

        def body(c: tuple, i: Any) -> tuple:
            cache, masks, user_carry = c
            line = i % size
            cache, masks = jax.lax.cond(
                line == 0,
                lambda: io_callback(fill_fn, (cache_spec, mask_spec), i // size, ordered=True),
                lambda: (cache, masks),
            )
            batch = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, line, keepdims=False), cache)
            mask = jax.lax.dynamic_index_in_dim(masks, line, keepdims=False)
            if information:
                batch = (batch, MiniBatchInformation(self._count, mask, batch_size))
            if masking:
                result, user_carry = fun(batch, mask, user_carry)
            else:
                result, user_carry = fun(batch, user_carry)
            return (cache, masks, user_carry), result

        empty = (jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache_spec),
                 jnp.zeros(mask_spec.shape, mask_spec.dtype))
        (_, _, carry), results = jax.lax.scan(
            body, empty + (carry,), jnp.arange(self._num_batches, dtype=jnp.int32)
        )
        if not masking:
            results = jax.tree.map(
                lambda r: r.reshape((-1,) + r.shape[2:])[: self._count], results
            )
        return FullDataState(passes=state.passes + 1), (results, carry)

    def release(self) -> None:
        """Closes the loader iterator of the last pass."""
        with self._lock:
            if self._iterator is not None:
                self._iterator.close()
                self._iterator = None


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
    if isinstance(data, DataLoader):
        if batch_size is not None or operations or worker_count:
            raise ValueError(
                "full_reference_data(loader): batch_size, operations and worker_count come "
                "from the DataLoader; leave them out"
            )
        batch = _find_batch(data.operations, "full_reference_data")
        if not batch.pad or not isinstance(data.operations[-1], Batch):
            raise ValueError("full_reference_data(loader): the last operation must be Batch(..., pad=True)")
        return FullReferenceData(data, cache_size, len(data.sampler))
    if batch_size is None:
        raise ValueError("full_reference_data(source, ...): pass batch_size=")
    batch_size = _check_positive("batch_size", batch_size)
    if any(isinstance(op, (Batch, FilterTransform)) for op in operations):
        raise ValueError("full_reference_data: operations must be per-record maps (no Batch, no filter)")
    source = _as_source(data)
    loader = DataLoader(
        data_source=source,
        sampler=IndexSampler(len(source), NoSharding(), shuffle=False, num_epochs=1),
        operations=list(operations) + [Batch(batch_size, pad=True)],
        worker_count=worker_count,
        shard_options=NoSharding(),
    )
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
    """A dict of arrays becomes an ``ArraysSource``; anything else is a source already."""
    if isinstance(data, dict):
        return ArraysSource(data)
    return data
