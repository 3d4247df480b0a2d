"""``jax_sgmc.data``: reference data inside jit-compiled functions (JaxSGMC 0.1.5's API).

``random_reference_data`` and ``full_reference_data`` read a ``HostDataLoader``'s
chains through grainlike's ``ReferenceData`` (``grainlike.jax.reference_data``):
a device-side cache of ``cached_batches_count`` batches, refilled by one ordered
host callback once every cached batch has been used, the next cache read ahead
in a thread. The loader decides the batches (``register_random_pipeline``,
``get_batches``), so JaxSGMC's loaders give JaxSGMC's batches. A state that is
used twice gives the same batches twice (grainlike's chains restore the loader's
position with ``save_state`` / ``load_state``), where JaxSGMC's host would hand out
the next ones.
"""

from __future__ import annotations

import abc
import itertools
import math
import threading
import warnings
from functools import partial
from typing import Any, Callable, Dict, NamedTuple, Optional, Protocol, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as onp
from jax import lax, tree_util

from grainlike.jax import reference_data as _reference_data
from grainlike.jax.host_callbacks import CallbackErrors, host_callback
from grainlike.jax.jit_batches import MiniBatchInformation

__all__ = [
    "Batch",
    "CacheState",
    "DataLoader",
    "DeviceDataLoader",
    "FullDataMapFunction",
    "FullDataMapperFunction",
    "GetBatchFunction",
    "HostDataLoader",
    "MappedFunction",
    "MaskedMappedFunction",
    "MiniBatch",
    "MiniBatchInformation",
    "OrderedBatch",
    "PyTree",
    "RandomBatch",
    "UnmaskedMappedFunction",
    "full_data_mapper",
    "full_reference_data",
    "random_data_state",
    "random_reference_data",
    "tree_dtype_struct",
    "tree_index",
]

PyTree = Any
Array = Any
MiniBatch = Union[Tuple[PyTree], Tuple[PyTree, MiniBatchInformation], Tuple[PyTree, MiniBatchInformation, Array]]


class DataLoader(metaclass=abc.ABCMeta):
    """What every data loader has: its static information and the shape of an observation."""

    @property
    @abc.abstractmethod
    def static_information(self) -> Dict:
        """Information about the dataset, such as ``{"observation_count": n}``."""

    @property
    @abc.abstractmethod
    def _format(self) -> PyTree:
        """``jax.ShapeDtypeStruct`` of a single observation."""

    def initializer_batch(self, mb_size: Optional[int] = None) -> PyTree:
        """An all-zero batch of ``mb_size`` observations (one observation, without a leading axis, for None).

        The dtypes are those the batches have inside jit (JAX's canonical dtypes).
        """

        def zeros(leaf: Any) -> Any:
            shape = tuple(int(s) for s in leaf.shape)
            if mb_size is not None:
                shape = (int(mb_size),) + shape
            return jnp.zeros(shape, jax.dtypes.canonicalize_dtype(leaf.dtype))

        return tree_util.tree_map(zeros, self._format)


class DeviceDataLoader(DataLoader, metaclass=abc.ABCMeta):
    """A loader whose whole dataset is on the device and is drawn from by jittable functions."""

    @abc.abstractmethod
    def init_random_data(self, *args: Any, **kwargs: Any) -> PyTree:
        """The state of a new chain of random draws."""

    @abc.abstractmethod
    def get_random_data(self, state: PyTree, batch_size: int) -> Tuple[PyTree, Tuple[PyTree, MiniBatchInformation]]:
        """``(state, (batch, info))``: a random batch (jittable, free of side effects)."""

    @abc.abstractmethod
    def get_full_data(self) -> Dict:
        """The whole dataset, a dict of arrays."""


class HostDataLoader(DataLoader, metaclass=abc.ABCMeta):
    """A loader on the host: chains registered by the feeds, read a cache of batches at a time."""

    def save_state(self, chain_id: int) -> Any:
        """What ``load_state`` needs to put chain ``chain_id`` back where it is now."""
        raise NotImplementedError("This method must be overwritten to allow checkpointing of the data loader.")

    def load_state(self, chain_id: int, data: Any) -> None:
        """Puts chain ``chain_id`` back where ``save_state`` saw it."""
        raise NotImplementedError("This method must be overwritten to allow checkpointing of the data loader.")

    @abc.abstractmethod
    def register_random_pipeline(self, cache_size: int = 1, mb_size: Optional[int] = None, **kwargs: Any) -> int:
        """A new chain of randomly assembled batches; its id."""

    @abc.abstractmethod
    def register_ordered_pipeline(self, cache_size: int = 1, mb_size: Optional[int] = None, **kwargs: Any) -> int:
        """A new chain of batches in the order of the observations; its id."""

    @abc.abstractmethod
    def get_batches(self, chain_id: int) -> Tuple[PyTree, Optional[Array]]:
        """``(batches, mask)``: the chain's next ``cache_size`` batches (mask None: all valid)."""

    def batch_format(self, cache_size: int, mb_size: int) -> Tuple[PyTree, MiniBatchInformation]:
        """``(ShapeDtypeStructs of a cache, MiniBatchInformation)`` of ``cache_size`` batches of ``mb_size``."""
        cache = tree_util.tree_map(
            lambda leaf: jax.ShapeDtypeStruct(
                dtype=leaf.dtype, shape=tuple(int(s) for s in itertools.chain([cache_size, mb_size], leaf.shape))),
            self._format,
        )
        info = MiniBatchInformation(observation_count=self.static_information["observation_count"],
                                    batch_size=mb_size, mask=onp.ones(mb_size, dtype=onp.bool_))
        return cache, info

    def _host_batches(self, chain_id: int) -> Tuple[PyTree, Optional[Array]]:
        """``get_batches`` as host arrays, for the refill callbacks (a loader may skip the device)."""
        batches, mask = self.get_batches(chain_id)
        return tree_util.tree_map(onp.asarray, batches), None if mask is None else onp.asarray(mask)


class CacheState(NamedTuple):
    """A chain's state: its cached batches and position (a JAX pytree; carry it through loops).

    Attributes:
      callback_uuid: unused (None): grainlike's chains are found by ``chain_id``.
      cached_batches: the cached batches, leading axis ``cached_batches_count``.
      cached_batches_count: batches per cache.
      current_line: the next cache line a batch is taken from.
      chain_id: the chain's id.
      state: for a host loader's chain, ``(fill, available, ok)``: the caches read
        so far, the lines holding data and whether the chain still reads data
        (grainlike's ``CacheState``); for a device loader's, the loader's state.
      valid: bool ``(cached_batches_count, mb_size)``, False for filler observations.
      token: unused (None).
    """

    callback_uuid: Any = None
    cached_batches: PyTree = None
    cached_batches_count: Array = None
    current_line: Array = None
    chain_id: Array = None
    state: PyTree = None
    valid: Array = None
    token: Any = None


random_data_state = CacheState

Batch = Union[Tuple[CacheState, PyTree], Tuple[CacheState, Tuple[PyTree, MiniBatchInformation]]]


class GetBatchFunction(Protocol):
    def __call__(self, data_state: CacheState, information: bool = False, device_count: int = 1) -> Batch:
        """``(state, batch)``, or ``(state, (batch, info))`` with ``information``."""


class MaskedMappedFunction(Protocol):
    def __call__(self, batch: PyTree, mask: Array, state: PyTree) -> Tuple[PyTree, PyTree]:
        """``(result, state)`` of a batch; ``mask`` is False for filler observations."""


class UnmaskedMappedFunction(Protocol):
    def __call__(self, batch: PyTree, state: PyTree) -> Tuple[PyTree, PyTree]:
        """``(results, state)``: one result per observation of the batch."""


MappedFunction = Union[MaskedMappedFunction, UnmaskedMappedFunction]


class FullDataMapFunction(Protocol):
    def __call__(self, fun: MappedFunction, data_state: CacheState, carry: PyTree, masking: bool = False,
                 information: bool = False, device_count: int = 1) -> Tuple[PyTree, PyTree]:
        """``(data_state, (results, carry))`` of ``fun`` mapped over the whole dataset."""


class FullDataMapperFunction(Protocol):
    def __call__(self, fun: MappedFunction, carry: PyTree, masking: bool = False, information: bool = False,
                 batched: bool = True, device_count: int = 1) -> PyTree:
        """``(results, carry)`` of ``fun`` mapped over the whole dataset."""


RandomBatch = Tuple[Any, GetBatchFunction, Callable[[], None]]
OrderedBatch = Tuple[Any, FullDataMapFunction, Callable[[], None]]


def tree_dtype_struct(pytree: PyTree) -> PyTree:
    """The tree with a ``jax.ShapeDtypeStruct`` for each leaf."""
    return tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(dtype=leaf.dtype, shape=leaf.shape), pytree)


def tree_index(pytree: PyTree, index: Any) -> PyTree:
    """Each leaf indexed along its first axis by ``index``."""
    return tree_util.tree_map(lambda leaf: leaf[index], pytree)


class _ChainReader:
    """A host loader's chain as a reader of grainlike's ``ReferenceData``: one ``get_batches`` per cache."""

    def __init__(self, loader: HostDataLoader, chain_id: int, cache_size: int, mb_size: int):
        self._loader = loader
        self._chain_id = chain_id
        self._mask_shape = (cache_size, mb_size)

    def read(self, count: int, batch_size: Optional[int]) -> tuple:
        batches, mask = self._loader._host_batches(self._chain_id)
        mask = onp.ones(self._mask_shape, bool) if mask is None else onp.asarray(mask, bool)
        return batches, mask, onp.int32(count)

    def get_state(self) -> Any:
        try:
            return self._loader.save_state(self._chain_id)
        except NotImplementedError:
            return None  # this loader's chains only go forwards

    def set_state(self, state: Any) -> None:
        if state is None:
            raise ValueError(
                f"{type(self._loader).__name__} cannot put a chain back to an earlier cache (it has no "
                "save_state/load_state): carry each state returned by the batch function forwards"
            )
        self._loader.load_state(self._chain_id, state)

    def close(self) -> None:
        pass


class _HostFeed:
    """Chains of one host loader (random or ordered) on a grainlike ``ReferenceData``."""

    def __init__(self, loader: HostDataLoader, cache_size: int, mb_size: int, ordered: bool):
        self._loader = loader
        self._cache_size = cache_size
        self._mb_size = mb_size
        self._ordered = ordered
        self._lock = threading.Lock()
        self._kwargs: dict = {}
        count = loader.static_information["observation_count"]
        self._data = _reference_data.ReferenceData(self._reader, cache_size, int(count), {})

    def _reader(self, unused_config: dict) -> _ChainReader:
        # Called by ReferenceData.init, in init's thread, with init's lock held.
        register = self._loader.register_ordered_pipeline if self._ordered else self._loader.register_random_pipeline
        chain_id = register(self._cache_size, mb_size=self._mb_size, **self._kwargs)
        return _ChainReader(self._loader, chain_id, self._cache_size, self._mb_size)

    def init(self, kwargs: dict) -> CacheState:
        with self._lock:
            self._kwargs = kwargs
            try:
                state = self._data.init()
            finally:
                self._kwargs = {}
        return CacheState(cached_batches=state.cache, cached_batches_count=jnp.array(self._cache_size),
                          current_line=state.line, chain_id=state.chain,
                          state=(state.fill, state.available, state.ok), valid=state.mask)

    def next(self, data_state: CacheState, information: bool) -> Batch:
        fill, available, ok = data_state.state
        state = _reference_data.CacheState(data_state.chain_id, fill, data_state.current_line, available,
                                           data_state.cached_batches, data_state.valid, ok)
        state, batch, info = self._data.next(state)
        new_state = data_state._replace(cached_batches=state.cache, current_line=state.line,
                                        state=(state.fill, state.available, state.ok), valid=state.mask)
        return (new_state, (batch, info)) if information else (new_state, batch)

    def release(self) -> None:
        self._data.release()


def _check_device_count(device_count: int) -> None:
    if device_count > jax.device_count():
        raise ValueError(
            f"The value of device_count cannot exceed the true device count. Expecting device_count "
            f"(given: {device_count}) <= {jax.device_count()}."
        )
    if device_count != 1:
        warnings.warn("Changing the device count can cause memory accumulation. Continue only if you "
                      "know what you are doing.")


def _warn_if_cache_exceeds(observation_count: int, cached_batches_count: int, mb_size: int) -> None:
    if observation_count < cached_batches_count * mb_size:
        warnings.warn("Cached batches are bigger than the total dataset. Consider using a DeviceDataLoader.")


def random_reference_data(data_loader: DataLoader, cached_batches_count: int, mb_size: int,
                          verify_calls: bool = False) -> RandomBatch:
    """Random batches inside jit-compiled functions: ``(init_fn, batch_fn, release)``.

    ``init_fn(**kwargs)`` starts a chain (the kwargs go to the loader's
    ``register_random_pipeline``: ``seed``, ``shuffle``, ``in_epochs`` for a
    ``NumpyDataLoader``); ``batch_fn(state, information=False)`` returns
    ``(state, batch)`` or ``(state, (batch, MiniBatchInformation))``;
    ``release()`` closes every chain. ``verify_calls`` is accepted and not needed:
    a chain's caches are numbered, so no request can take another's.

    Example:
      >>> import numpy as onp
      >>> from grainlike.compat.jax_sgmc.data.numpy_loader import NumpyDataLoader
      >>> loader = NumpyDataLoader(x=onp.arange(10))
      >>> init_fn, batch_fn, release = random_reference_data(loader, 2, 3)
      >>> state, batch = batch_fn(init_fn(seed=0))
      >>> batch["x"].shape
      (3,)
      >>> release()
    """
    observation_count = data_loader.static_information["observation_count"]
    if observation_count < mb_size:
        raise ValueError(f"Batch size cannot be bigger than the number of total observations. Got "
                         f"{observation_count} and {mb_size}.")
    if cached_batches_count <= 0 or mb_size <= 0:
        raise ValueError(f"Cache size and batch size must be positive, got{cached_batches_count} and {mb_size}.")
    if isinstance(data_loader, HostDataLoader):
        _warn_if_cache_exceeds(observation_count, cached_batches_count, mb_size)
        feed = _HostFeed(data_loader, cached_batches_count, mb_size, ordered=False)

        def init_fn(**kwargs: Any) -> CacheState:
            return feed.init(kwargs)

        def batch_fn(data_state: CacheState, information: bool = False, device_count: int = 1) -> Batch:
            _check_device_count(device_count)
            return feed.next(data_state, information)

        return init_fn, batch_fn, feed.release
    if isinstance(data_loader, DeviceDataLoader):
        if cached_batches_count != 1:
            raise ValueError("No caching on device.")

        def device_init_fn(**kwargs: Any) -> CacheState:
            return CacheState(state=data_loader.init_random_data(**kwargs))

        def device_batch_fn(data_state: CacheState, information: bool = False) -> Batch:
            state, (batch, info) = data_loader.get_random_data(data_state.state, batch_size=mb_size)
            return (CacheState(state=state), (batch, info)) if information else (CacheState(state=state), batch)

        return device_init_fn, device_batch_fn, lambda: None
    raise TypeError("The DataLoader must inherit from HostDataLoader or DeviceDataLoader")


def _device_ordered_batches(data_loader: DeviceDataLoader, mb_size: int) -> tuple:
    """``(init_fn, batch_fn)`` of a device loader's data in order, wrapping around at the end."""
    reference = data_loader.get_full_data()
    count = data_loader.static_information["observation_count"]
    info = MiniBatchInformation(observation_count=count, batch_size=mb_size, mask=onp.ones(mb_size))

    def init_fn(offset: Any = 0) -> CacheState:
        if offset >= count:
            raise ValueError(f"The offset cannot be greater than the total observation count. Given {offset} "
                             f"and {count}.")
        return CacheState(current_line=offset)

    def batch_fn(data_state: CacheState, information: bool = False, device_count: int = 1) -> Batch:
        indices = jnp.mod(jnp.arange(mb_size) + data_state.current_line, count)
        new_state = CacheState(current_line=jnp.mod(indices[-1] + 1, count))
        batch = tree_index(reference, indices)
        return (new_state, (batch, info)) if information else (new_state, batch)

    return init_fn, batch_fn


def full_reference_data(data_loader: DataLoader, cached_batches_count: int = 100,
                        mb_size: Optional[int] = None) -> OrderedBatch:
    """A function mapped over every observation inside jit: ``(init_fn, map_fn, release)``.

    ``map_fn(fun, data_state, carry, masking=False, information=False)`` runs a
    ``lax.scan`` over the ``ceil(n / mb_size)`` batches of the data in order and
    returns ``(data_state, (results, carry))``. The last batch is filled up with
    the first observations again; with ``masking=True`` ``fun(batch, mask, carry)``
    gets a mask that is False for them and returns one result per batch, else
    ``fun(batch, carry)`` returns one per observation and the fillers' are dropped.
    (For a ``DeviceDataLoader`` JaxSGMC 0.1.5 uses ``cached_batches_count`` as the
    batch size; so does this.)

    Example:
      >>> import jax.numpy as jnp
      >>> from grainlike.compat.jax_sgmc.data.numpy_loader import NumpyDataLoader
      >>> init_fn, map_fn, release = full_reference_data(NumpyDataLoader(b=jnp.arange(10)), 2, 4)
      >>> _, (sums, _) = map_fn(lambda d, m, c: (jnp.sum(m * d["b"]), c), init_fn(), None, masking=True)
      >>> int(jnp.sum(sums))
      45
      >>> release()
    """
    observation_count = data_loader.static_information["observation_count"]
    if observation_count < mb_size:
        raise ValueError(f"Batch size cannot be bigger than the number of total observations. Got "
                         f"{observation_count} and {mb_size}.")
    if isinstance(data_loader, HostDataLoader):
        _warn_if_cache_exceeds(observation_count, cached_batches_count, mb_size)
        feed = _HostFeed(data_loader, cached_batches_count, mb_size, ordered=True)

        def init_fn(**kwargs: Any) -> CacheState:
            return feed.init(kwargs)

        def batch_fn(data_state: CacheState, information: bool = False, device_count: int = 1) -> Batch:
            return feed.next(data_state, information)

        release = feed.release
        batch_size = mb_size
    elif isinstance(data_loader, DeviceDataLoader):
        batch_size = cached_batches_count
        init_fn, batch_fn = _device_ordered_batches(data_loader, batch_size)
        release = lambda: None  # noqa: E731
    else:
        raise TypeError("The DataLoader must inherit from HostDataLoader or DeviceDataLoader")
    num_iterations = math.ceil(observation_count / batch_size)

    def map_fn(fun: MappedFunction, data_state: CacheState, carry: PyTree, masking: bool = False,
               information: bool = False, device_count: int = 1) -> Tuple[PyTree, PyTree]:
        def body(c: tuple, iteration: Any) -> tuple:
            data_state, fun_state = c
            # True for the observations of this pass, False for the fillers of its last batch.
            mask = iteration * batch_size + jnp.arange(batch_size) < observation_count
            data_state, batch = batch_fn(data_state, information=information, device_count=device_count)
            result, fun_state = fun(batch, mask, fun_state) if masking else fun(batch, fun_state)
            return (data_state, fun_state), result

        (data_state, carry), results = lax.scan(body, (data_state, carry), onp.arange(num_iterations))
        if not masking:
            results = tree_util.tree_map(
                lambda r: jnp.concatenate(r, axis=0)[:observation_count], results)
        return data_state, (results, carry)

    return init_fn, map_fn, release


class _StatePool:
    """Unused chain states on the host, handed to and taken back from jitted code by callbacks."""

    def __init__(self, init_fn: Callable[[], CacheState]):
        self._init_fn = init_fn
        self._lock = threading.Lock()
        first = init_fn()
        self._unused = [jax.tree.map(onp.asarray, first)]
        self.specs = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(onp.shape(x), jax.dtypes.canonicalize_dtype(onp.asarray(x).dtype)), first)
        self.errors = CallbackErrors("full data mapper")

    def take(self, unused: Any) -> CacheState:
        with self._lock:
            if self._unused:
                return self._unused.pop()
        return self._init_fn()

    def give_back(self, state: CacheState) -> Any:
        with self._lock:
            self._unused.append(state)
        return onp.int32(0)

    def clear(self) -> None:
        with self._lock:
            self._unused = []
        self.errors.clear()


def full_data_mapper(data_loader: Optional[DataLoader] = None, cached_batches_count: int = 1,
                     mb_size: int = 1) -> Tuple[FullDataMapperFunction, Callable[[], None]]:
    """``full_reference_data`` without a state to carry: ``(mapper_fn, release)``.

    ``mapper_fn(fun, carry, masking=False, information=False, batched=True)``
    returns ``(results, carry)``. The chain states are kept on the host and taken
    by the jitted code when it maps; ``batched=False`` vmaps ``fun`` over the
    observations of a batch (no masking then).
    """
    init_fn, map_fn, cleanup = full_reference_data(data_loader, cached_batches_count, mb_size)
    pool = _StatePool(init_fn)
    one = jax.ShapeDtypeStruct((), jnp.int32)

    def mapper_fn(fun: MappedFunction, carry: PyTree, masking: bool = False, information: bool = False,
                  batched: bool = True, device_count: int = 1) -> PyTree:
        pool.errors.raise_pending()
        if batched:
            batched_fun = fun
        elif masking:
            raise ValueError("The function must be vectorized manually to allow masking.")
        elif mb_size == 1:
            def batched_fun(batch: PyTree, state: PyTree) -> tuple:
                result, state = fun(tree_util.tree_map(partial(jnp.squeeze, axis=0), batch), state)
                return tree_util.tree_map(partial(jnp.expand_dims, axis=0), result), state
        else:
            vmapped = jax.vmap(fun, in_axes=(0, None))

            def batched_fun(batch: PyTree, state: PyTree) -> tuple:
                # Each observation's call returns a state; the first one's goes on.
                results, states = vmapped(batch, state)
                return results, None if states is None else tree_util.tree_map(lambda s: s[0], states)

        _, data_state = host_callback(pool.errors, pool.take, pool.specs, jnp.int32(0))
        data_state, results = map_fn(batched_fun, data_state, carry, masking=masking, information=information,
                                     device_count=device_count)
        host_callback(pool.errors, pool.give_back, one, data_state)
        return results

    def release() -> None:
        cleanup()
        pool.clear()

    return mapper_fn, release
