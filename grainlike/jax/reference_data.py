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

No exception ever leaves one of grainlike's host callbacks (on GPUs one would
poison every later computation of the process): a callback that fails (the end
of the data, a failing source or transform, a released chain) keeps its
exception and returns zeros with ``ok=False`` (``CacheState.ok``,
``FullDataState.ok``). The host raises the original exception afterwards: on
leaving ``with host_errors():`` (or a function under ``@host_errors()``), by the
feed's next host call, or at once when the call was not traced. Host callbacks
need JAX's ``cpu`` platform (``JAX_PLATFORMS=cuda,cpu``, not ``cuda`` alone); its
absence is raised when the program is traced. Importing this module costs numpy
only; jax is imported when a feed is used.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import json
import logging
import sys
import threading
import weakref
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np

from grainlike.core import tree
from grainlike.core.read_ahead import ERROR, Prefetcher
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

# Fill states kept per chain: a state up to this many fills old can still be
# continued, saved or replayed.
_KEPT_FILLS = 16


# -- host errors ------------------------------------------------------------------------
#
# Nothing grainlike runs inside a JAX host callback raises out of it: on GPUs an
# exception raised in an ordered callback poisons the runtime token of ordered
# effects, and every later synchronisation of the process fails with it. A
# callback reports failure as data instead (``ok=False`` and zero-filled outputs
# of the shapes and dtypes the program expects), keeps the exception, and the host
# raises it after the jitted call: the owner's next host call, ``host_errors``'s
# exit, or at once when the call was not traced (its ``ok`` is a concrete value).

_logger = logging.getLogger("grainlike")


class _Registry:
    """Which feeds' callbacks reported a pending exception, by when they last did (bounded).

    A callback reports its feed's pending exception when it catches it, and again
    each time it is called while the exception is still pending, so that a
    ``host_errors`` context around a later computation of that feed raises it.
    Feeds are held by weak references: a feed nobody holds is not kept alive.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._entries: collections.deque = collections.deque(maxlen=64)  # (count, weakref)

    def add(self, errors: "CallbackErrors") -> None:
        with self._lock:
            self._count += 1
            kept = [(n, ref) for n, ref in self._entries if ref() is not None and ref() is not errors]
            self._entries = collections.deque(kept, maxlen=64)
            self._entries.append((self._count, weakref.ref(errors)))

    def mark(self) -> int:
        with self._lock:
            return self._count

    def take_first_since(self, mark: int) -> Optional[BaseException]:
        """The pending exception of the feed that reported first after ``mark``; it is taken."""
        with self._lock:
            reported = [ref() for n, ref in self._entries if n > mark]
        for errors in reported:
            error = errors.take() if errors is not None else None
            if error is not None:
                return error
        return None


_REGISTRY = _Registry()


class CallbackErrors:
    """The exception a feed's host callbacks caught, held until the host raises it.

    Each feed (an ``InJitIterator``, a ``ReferenceData``, a ``FullReferenceData``,
    the functions of one ``io.save``) has one. Its callbacks run through
    ``guard``: whatever they raise is kept here and the callback returns
    ``ok=False`` with zero-filled outputs. While an exception is pending, the
    guarded callbacks return at once without calling the feed, so no data is
    consumed and the feed stays at the last batch it delivered. ``raise_pending``
    raises it on the host, once; ``host_errors`` does too.

    Args:
      owner: the feed's name, for the log line and for errors.
    """

    def __init__(self, owner: str):
        self._owner = owner
        self._lock = threading.Lock()
        self._pending: Optional[BaseException] = None

    @property
    def failed(self) -> bool:
        """Whether an exception is pending."""
        return self._pending is not None

    def record(self, error: BaseException) -> None:
        """Keeps ``error`` (the first one, while one is pending). Never raises."""
        with self._lock:
            if self._pending is not None:
                return
            self._pending = error
        _REGISTRY.add(self)
        try:
            _logger.warning(
                "%s: a host callback failed with %s: %s; the jitted computation goes on with "
                "zero-filled data and ok=False, and the exception is raised on the host by "
                "`with grainlike.host_errors():` around the call or by the next call on %s",
                self._owner, type(error).__name__, _describe(error), self._owner,
            )
        except BaseException:  # pragma: no cover - a broken handler must not raise here
            pass

    def take(self) -> Optional[BaseException]:
        """The pending exception, if any, which is no longer pending."""
        with self._lock:
            error, self._pending = self._pending, None
            return error

    def clear(self) -> None:
        """Forgets the pending exception without raising it (``close()``)."""
        with self._lock:
            self._pending = None

    def raise_pending(self) -> None:
        """Raises the pending exception, if any, as itself (its traceback and cause kept)."""
        error = self.take()
        if error is not None:
            raise error

    def raise_failed(self) -> None:
        """Called when a computation's ``ok`` came back False: raises what made it so."""
        self.raise_pending()
        raise RuntimeError(
            f"{self._owner}: the data of this computation is incomplete (ok is False): a host "
            "callback failed, and its exception was raised before (by host_errors or an earlier "
            "call on the feed)"
        )

    def check(self, ok: Any) -> None:
        """Raises the pending exception now if ``ok`` is a concrete False (an untraced call)."""
        import jax

        if not isinstance(ok, jax.core.Tracer) and not bool(ok):
            self.raise_failed()

    def guard(self, fn: Callable[..., Any], specs: Any) -> Callable[..., tuple]:
        """``fn`` as a host callback that never raises: it returns ``(ok, outputs)``.

        ``outputs`` are ``fn``'s, checked against ``specs`` (a JAX pytree of
        ``ShapeDtypeStruct``) and cast to their dtypes, or zeros of ``specs``
        when ``fn`` raised (or an exception was already pending).
        """

        def callback(*args: Any) -> tuple:
            if self._pending is None:
                try:
                    return np.bool_(True), _conform(fn(*args), specs, self._owner)
                except BaseException as e:  # reported as data, raised on the host
                    self.record(e)
            else:
                _REGISTRY.add(self)  # for a host_errors context around this computation
            return np.bool_(False), _zeros(specs)

        return callback


def _describe(error: BaseException) -> str:
    try:
        return str(error)
    except BaseException:
        return f"<unprintable {type(error).__name__}>"


def _conform(out: Any, specs: Any, owner: str) -> Any:
    """``out`` with ``specs``' structure, shapes and dtypes, or a ValueError naming the difference."""
    import jax

    spec_leaves, treedef = jax.tree.flatten(specs)
    try:
        leaves = treedef.flatten_up_to(out)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"{owner}: the host returned {jax.tree.structure(out)} where the compiled program "
            f"expects {treedef}"
        ) from e
    conformed = []
    for leaf, spec in zip(leaves, spec_leaves):
        leaf = np.asarray(leaf)
        if leaf.shape != tuple(spec.shape):
            raise ValueError(
                f"{owner}: the host returned an array of shape {leaf.shape} where the compiled "
                f"program expects {tuple(spec.shape)}"
            )
        conformed.append(leaf.astype(spec.dtype, copy=False))
    return treedef.unflatten(conformed)


def _zeros(specs: Any) -> Any:
    import jax

    return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), specs)


def host_callback(errors: CallbackErrors, fn: Callable[..., Any], specs: Any, *args: Any) -> tuple:
    """``(ok, outputs)`` of ``fn(*args)`` run on the host by an ordered ``io_callback``.

    ``ok`` is a bool scalar, False when ``fn`` raised (kept in ``errors``) or an
    exception was pending; ``outputs`` are then zeros of ``specs``.

    Raises:
      RuntimeError: JAX has no ``cpu`` backend to run host callbacks with.
    """
    import jax
    import jax.numpy as jnp
    from jax.experimental import io_callback

    _require_cpu_backend()
    ok_spec = jax.ShapeDtypeStruct((), jnp.bool_)
    return io_callback(errors.guard(fn, specs), (ok_spec, specs), *args, ordered=True)


_CPU_BACKEND: list = []  # [True] once the cpu backend was found


def _require_cpu_backend() -> None:
    """JAX runs a host callback's arguments through a ``cpu`` device: one must exist.

    ``jax.experimental.io_callback`` (``io_callback_impl`` in jax/_src/callback.py)
    looks up ``jax.local_devices(backend="cpu")`` each time a callback runs; under
    ``JAX_PLATFORMS=cuda`` there is none, and that lookup raises inside the
    callback, where it poisons the process. So it is checked here, when the
    program is traced.
    """
    if _CPU_BACKEND:
        return
    import jax

    try:
        jax.local_devices(backend="cpu")
    except RuntimeError as e:
        raise RuntimeError(
            "grainlike feeds jitted code through jax.experimental.io_callback, which runs host "
            f"callbacks with a 'cpu' device, and JAX has none (jax_platforms="
            f"{jax.config.jax_platforms!r}): set JAX_PLATFORMS=cuda,cpu (your accelerator, then "
            "cpu) before jax is imported, or leave JAX_PLATFORMS unset"
        ) from e
    _CPU_BACKEND.append(True)


class host_errors(contextlib.ContextDecorator):
    """Raises, on exit, the exception a grainlike host callback caught during the context.

    A grainlike callback inside a jitted computation never raises (on GPUs that
    would poison every later computation of the process): it returns zeros and
    ``ok=False`` and keeps the exception. On leaving this context (or a function
    decorated with ``@host_errors()``), JAX's pending host callbacks are waited
    for (``jax.effects_barrier()``) and the first exception a grainlike callback
    reported during the context (``EOFError`` at the end of the data, say) is
    raised as itself, with its message, traceback and cause: one it caught, or
    one caught earlier that no one raised yet, which its feed's callbacks report
    again each time they run. Exceptions of other callbacks, and any exception
    already leaving the context, pass unchanged.

    Example:
      with grain.host_errors():
          params = jax.block_until_ready(train(params))   # EOFError at the end of data
    """

    def __enter__(self) -> "host_errors":
        self._mark = _REGISTRY.mark()
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> bool:
        if value is not None:
            return False
        jax = sys.modules.get("jax")
        if jax is not None:
            jax.effects_barrier()
        error = _REGISTRY.take_first_since(self._mark)
        if error is not None:
            raise error
        return False


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
      ok: bool scalar, False once a refill failed (the end of the data, a failing
        transform, ...): from then on ``next`` returns zero batches with an
        all-False mask and the position stays after the last batch delivered;
        the exception is raised on the host (``host_errors``, or the next
        ``init`` / ``next`` / ``get_state`` / ``restore`` of this reference data).
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
    once per ``cache_size`` batches (one ordered ``io_callback``), and returns
    every batch of the chain, in order. Not usable under ``vmap`` (ordered
    callbacks are not batched): give each chain its own state.

    A refill that fails inside a jitted computation does not raise there: the
    state's ``ok`` turns False, the batches are zeros with an all-False mask,
    and the exception (``EOFError`` at the end of the data, or what the loader
    raised) is raised on the host by ``host_errors`` around the call, or by the
    next ``init`` / ``next`` / ``get_state`` / ``restore``. Until then no refill
    of any chain of this reference data reads data.
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
        self._errors = CallbackErrors("reference data")

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
            cache=jax.tree.map(jnp.asarray, _cast(cache, self._specs[0])),
            mask=jnp.asarray(mask),
            ok=jnp.bool_(True),
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

        A refill that fails (EOFError when the chain's loader has ended, or what
        the loader raised) turns the state's ``ok`` False and gives zero
        batches with an all-False ``info.mask``; inside a trace the exception
        is raised on the host afterwards (see ``host_errors``), called eagerly
        it is raised here.
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
        batch = jax.tree.map(lambda c: jax.lax.dynamic_index_in_dim(c, line, keepdims=False), state.cache)
        mask = jax.lax.dynamic_index_in_dim(state.mask, line, keepdims=False)
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
    """State of ``FullReferenceData.map`` (JaxSGMC's ``data_state``).

    Attributes:
      passes: passes made so far (int32 scalar).
      ok: bool scalar, False once a pass could not read all its batches (a
        failing transform or source, ...): that pass saw zero batches with an
        all-False mask from the failure on, and the exception is raised on the
        host (``host_errors``, or the next ``init`` / ``map``).
    """

    passes: Any
    ok: Any = True


class FullReferenceData:
    """Maps a function over every record exactly once, inside jitted code.

    Build one with ``full_reference_data(...)``. ``map`` runs a ``lax.scan`` over
    the ``ceil(n / batch_size)`` batches of one pass (the last padded with zeros
    and masked); the batches come from the host through one ordered callback per
    ``cache_size`` batches, so the program holds no data.

    A callback that fails inside a jitted computation does not raise there: the
    rest of the pass gets zero batches with an all-False mask, the returned
    state's ``ok`` is False, and the exception is raised on the host by
    ``host_errors`` around the call, or by the next ``init`` / ``map``. Called
    eagerly, ``map`` raises it itself.
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
        self._errors = CallbackErrors("full reference data")

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
        pass could not read all its batches (see the class).
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
            batch = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, line, keepdims=False), cache)
            mask = jax.lax.dynamic_index_in_dim(masks, line, keepdims=False)
            if information:
                batch = (batch, MiniBatchInformation(self._count, mask, batch_size))
            if masking:
                result, user_carry = fun(batch, mask, user_carry)
            else:
                result, user_carry = fun(batch, user_carry)
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

    def release(self) -> None:
        """Closes the loader iterator of the last pass; forgets an exception no one raised."""
        self._errors.clear()
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
