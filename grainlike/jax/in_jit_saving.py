"""Saving samples from inside ``jax.jit`` / ``lax.scan``, and resumable runs (JaxSGMC's ``io``).

``save(collector)`` returns JaxSGMC's three functions::

    init_save, save, postprocess_save = grainlike.io.save(MemoryCollector())
    state = init_save(init_sample, init_checkpoint, samples_collected)   # on the host
    state, _ = save(state, keep, sample)                                  # in jit/scan, per step
    out = postprocess_save(state, None)   # {'sample_count': ..., 'samples': ...}

``save`` sends a kept sample to the host with one ordered ``io_callback``, where
the collector writes it: ``MemoryCollector`` into preallocated numpy arrays (and
an ``.npz`` per chain if given a directory), ``HDF5Collector`` into an ``h5py``
file (the ``hdf5`` extra). ``samples_collected`` is the number of samples to make
room for: an int, or an object with a ``samples_collected`` attribute (JaxSGMC's
``scheduler.static_information``).

Beyond JaxSGMC: with ``checkpoint_every=N`` and a ``checkpoint_dir``, every N-th
``save`` call also writes a checkpoint (atomically) holding the step count, the
samples collected so far, the user's carry (``save(..., checkpoint=carry)``) and
the position of a ``grainlike.reference_data`` chain (``data_state=``). After a
crash, ``load(checkpoint_dir, init_checkpoint, data=...)`` returns that step, the
carry and a data state that continues where the saved one was, and
``init_save(..., resume=checkpoint)`` continues collecting after the saved
samples: the resumed run ends with the same samples as an uninterrupted one.

Nothing raises inside the callbacks (on GPUs an exception there would poison
every later computation of the process). A save or checkpoint that fails (a
collector with no room left, a chain position no longer kept, a full disk, ...)
keeps its exception and reports failure as data: the sample is not counted in
``saved_samples``, and from then on the callbacks of that ``save(...)`` write
nothing. The exception is raised on the host by ``postprocess_save`` (or
``init_save``, or a new trace of ``save``), or on leaving ``with
grainlike.host_errors():`` around the jitted call.

jax is imported when the functions are used; h5py when an ``HDF5Collector`` is made.
"""

from __future__ import annotations

import abc
import json
import os
import tempfile
import threading
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from grainlike.core.tree import map_structure, map_structure_with_key_path
from grainlike.jax.host_callbacks import CallbackErrors, host_callback

__all__ = [
    "Checkpoint",
    "DataCollector",
    "HDF5Collector",
    "MemoryCollector",
    "NoSaveState",
    "SavingState",
    "dict_to_pytree",
    "load",
    "no_save",
    "pytree_dict_keys",
    "pytree_to_dict",
    "register_dictionize_rule",
    "save",
]


# -- pytrees as dicts ---------------------------------------------------------------------


# Rules for node types of the user's: type -> rule(node) -> [(name, child), ...].
_DICTIONIZE_RULES: dict = {}


def register_dictionize_rule(node_type: type) -> Callable[[Callable[[Any], Any]], None]:
    """Decorator: how a pytree node of ``node_type`` becomes a dict (JaxSGMC's ``io`` API).

    The decorated function takes a node and returns its ``(name, child)`` pairs,
    in the order of the node's leaves; ``pytree_to_dict``, ``pytree_dict_keys``,
    ``dict_to_pytree`` and the collectors then name its leaves by them. Dicts,
    lists, tuples and namedtuples have rules already.

    Example:
      >>> class Pair:
      ...     def __init__(self, a, b):
      ...         self.a, self.b = a, b
      >>> @register_dictionize_rule(Pair)
      ... def _pair(node):
      ...     return [("a", node.a), ("b", node.b)]
      >>> pytree_to_dict({"p": Pair(1.0, [2.0])})
      {'p': {'a': 1.0, 'b': {'list_element_0': 2.0}}}

    Raises:
      ValueError: a rule for ``node_type`` exists already.
    """
    if not isinstance(node_type, type):
        raise TypeError(f"register_dictionize_rule takes a type, got {node_type!r}")

    def register(rule: Callable[[Any], Any]) -> None:
        if node_type in _DICTIONIZE_RULES:
            raise ValueError(f"a dictionize rule for {node_type.__name__} is already registered")
        _DICTIONIZE_RULES[node_type] = rule

    return register


def _children(node: Any) -> Optional[list]:
    """``[(name, child), ...]`` of a container node (JaxSGMC's names), None for a leaf."""
    if node is None:
        return []
    for node_type, rule in _DICTIONIZE_RULES.items():
        if isinstance(node, node_type):
            return [(str(k), v) for k, v in rule(node)]
    if isinstance(node, dict):
        # JAX flattens a dict in sorted key order; leaves here follow the same order.
        return [(k, node[k]) for k in sorted(node)]
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        return list(zip(node._fields, node))
    if isinstance(node, (list, tuple)):
        return [(f"list_element_{i}", v) for i, v in enumerate(node)]
    return None


def pytree_to_dict(tree: Any) -> Any:
    """A pytree of dicts, lists, tuples and namedtuples as nested dicts (JaxSGMC's keys).

    Lists and tuples become ``{"list_element_0": ..., ...}``, namedtuples dicts of
    their fields; leaves stay as they are.

    Example:
      >>> pytree_to_dict({'a': 0.0, 'b': {'b1': [0.0, 0.1], 'b2': 0.0}})
      {'a': 0.0, 'b': {'b1': {'list_element_0': 0.0, 'list_element_1': 0.1}, 'b2': 0.0}}
    """
    children = _children(tree)
    if children is None:
        return tree
    return {str(k): pytree_to_dict(v) for k, v in children}


def _keyed_leaves(pytree: Any) -> list:
    """``(key path, leaf)`` of every leaf of ``pytree_to_dict(pytree)``, in leaf order (core.tree's walk)."""
    out: list = []
    map_structure_with_key_path(lambda path, leaf: out.append((path, leaf)), pytree_to_dict(pytree),
                                is_leaf=_not_a_dict)
    return out


def _not_a_dict(node: Any) -> bool:
    # pytree_to_dict makes every node a plain dict; anything else is one of its leaves.
    return type(node) is not dict


def pytree_dict_keys(tree: Any) -> list:
    """The key path of every leaf of ``pytree_to_dict(tree)``, in leaf order.

    Example:
      >>> pytree_dict_keys({"a": [0.0, 1.0], "b": 2.0})
      [('a', 'list_element_0'), ('a', 'list_element_1'), ('b',)]
    """
    return [path for path, _ in _keyed_leaves(tree)]


def dict_to_pytree(pytree_as_dict: Any, target: Any) -> Any:
    """Rebuilds ``target``'s structure from ``pytree_to_dict``'s form (also of a subtree).

    Example:
      >>> tree = {'a': 0.0, 'b': {'b1': [0.0, 0.1], 'b2': 0.0}}
      >>> dict_to_pytree(pytree_to_dict(tree)['b'], tree['b'])
      {'b1': [0.0, 0.1], 'b2': 0.0}

    Raises:
      KeyError: the dict lacks a key the target has (the message names its path).
    """

    def build(node: Any, target_node: Any, path: tuple) -> Any:
        children = _children(target_node)
        if children is None:
            return node
        if target_node is None:
            return None
        values = []
        for k, v in children:
            if not isinstance(node, dict) or str(k) not in node:
                raise KeyError(f"dict_to_pytree: no key {'/'.join(path + (str(k),))!r} in the dict")
            values.append(build(node[str(k)], v, path + (str(k),)))
        if isinstance(target_node, dict):
            return dict(zip([k for k, _ in children], values))
        if isinstance(target_node, tuple) and hasattr(target_node, "_fields"):
            return type(target_node)(*values)
        return type(target_node)(values)

    return build(pytree_as_dict, target, ())


def _leaves(pytree: Any) -> list:
    return [leaf for _, leaf in _keyed_leaves(pytree)]


# -- collectors -------------------------------------------------------------------------


def _count(samples_collected: Any) -> int:
    n = getattr(samples_collected, "samples_collected", samples_collected)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(
            "samples_collected must be an int >= 0 (or have a samples_collected attribute), "
            f"got {samples_collected!r}"
        )
    return int(n)


class DataCollector(abc.ABC):
    """Where saved samples go, on the host. One instance serves several chains."""

    @abc.abstractmethod
    def register_chain(self, init_sample: Any, samples_collected: int) -> int:
        """Makes room for ``samples_collected`` samples shaped like ``init_sample``; its id."""

    @abc.abstractmethod
    def save(self, chain_id: int, index: int, leaves: list) -> None:
        """Stores sample number ``index`` (its leaves, in ``init_sample``'s order)."""

    @abc.abstractmethod
    def checkpoint(self, chain_id: int, count: int) -> dict:
        """Makes the first ``count`` samples durable; arrays a checkpoint must hold for them."""

    @abc.abstractmethod
    def resume(self, chain_id: int, count: int, arrays: dict) -> None:
        """Restores the first ``count`` samples from what ``checkpoint`` returned."""

    @abc.abstractmethod
    def finished(self, chain_id: int) -> Any:
        """Called after the run; returns what ``postprocess_save`` reports as ``samples``."""


class MemoryCollector(DataCollector):
    """Samples in numpy arrays in RAM; with ``save_dir``, also ``chain_<id>.npz`` files.

    The arrays are allocated for ``samples_collected`` samples up front; rows after
    the last saved sample stay zero (``sample_count`` says how many are real).
    """

    def __init__(self, save_dir: Optional[str] = None):
        self._dir = save_dir
        self._lock = threading.Lock()
        self._samples: list = []
        self._templates: list = []

    def register_chain(self, init_sample: Any, samples_collected: int) -> int:
        n = _count(samples_collected)
        with self._lock:
            self._samples.append([np.zeros((n,) + np.shape(x), np.asarray(x).dtype) for x in _leaves(init_sample)])
            self._templates.append(init_sample)
            return len(self._samples) - 1

    def save(self, chain_id: int, index: int, leaves: list) -> None:
        arrays = self._samples[chain_id]
        if index >= len(arrays[0]) if arrays else False:
            raise IndexError(
                f"MemoryCollector: chain {chain_id} got sample {index + 1}, more than the "
                f"samples_collected={len(arrays[0])} made room for"
            )
        for array, leaf in zip(arrays, leaves):
            array[index] = leaf

    def _names(self, chain_id: int) -> list:
        return ["/".join(k) or "sample" for k in pytree_dict_keys(self._templates[chain_id])]

    def checkpoint(self, chain_id: int, count: int) -> dict:
        return {f"sample:{name}": a[:count] for name, a in zip(self._names(chain_id), self._samples[chain_id])}

    def resume(self, chain_id: int, count: int, arrays: dict) -> None:
        for name, a in zip(self._names(chain_id), self._samples[chain_id]):
            a[:count] = arrays[f"sample:{name}"]

    def finished(self, chain_id: int) -> Any:
        samples = self._samples[chain_id]
        if self._dir:
            os.makedirs(self._dir, exist_ok=True)
            np.savez(os.path.join(self._dir, f"chain_{chain_id}.npz"),
                     **dict(zip(self._names(chain_id), samples)))
        return _unflatten(self._templates[chain_id], samples)


class HDF5Collector(DataCollector):
    """Samples written into an open ``h5py.File``, one dataset per leaf.

    Datasets are named ``/chain~<id>/<key path>`` (the keys of ``pytree_to_dict``)
    with a leading axis of ``samples_collected``. On a resumed run, open the same
    file with mode ``"a"``: the datasets are reused and the samples of the
    checkpoint stay. ``postprocess_save`` reports the file's datasets as samples.
    """

    def __init__(self, file: Any):
        try:
            import h5py  # noqa: F401
        except ImportError as e:  # pragma: no cover - the hdf5 extra installs it
            raise ImportError("HDF5Collector needs h5py: pip install 'grainlike[hdf5]'") from e
        self._file = file
        self._lock = threading.Lock()
        self._names: list = []
        self._templates: list = []

    def register_chain(self, init_sample: Any, samples_collected: int) -> int:
        n = _count(samples_collected)
        with self._lock:
            chain_id = len(self._names)
            names = ["/".join((f"/chain~{chain_id}",) + k) for k in pytree_dict_keys(init_sample)]
            for name, leaf in zip(names, _leaves(init_sample)):
                shape = (n,) + np.shape(leaf)
                self._file.require_dataset(name, shape=shape, dtype=np.asarray(leaf).dtype)
            self._names.append(names)
            self._templates.append(init_sample)
            return chain_id

    def save(self, chain_id: int, index: int, leaves: list) -> None:
        for name, leaf in zip(self._names[chain_id], leaves):
            dataset = self._file[name]
            if index >= dataset.shape[0]:
                raise IndexError(
                    f"HDF5Collector: chain {chain_id} got sample {index + 1}, more than the "
                    f"samples_collected={dataset.shape[0]} made room for"
                )
            dataset[index] = leaf

    def checkpoint(self, chain_id: int, count: int) -> dict:
        self._file.flush()
        return {}

    def resume(self, chain_id: int, count: int, arrays: dict) -> None:
        pass  # the samples are in the file

    def finished(self, chain_id: int) -> Any:
        self._file.flush()
        return _unflatten(self._templates[chain_id], [self._file[n] for n in self._names[chain_id]])


def _unflatten(template: Any, leaves: list) -> Any:
    it = iter(leaves)
    as_dict = map_structure(lambda _: next(it), pytree_to_dict(template), is_leaf=_not_a_dict)
    return dict_to_pytree(as_dict, template)


# -- saving inside jit ------------------------------------------------------------------


class SavingState(NamedTuple):
    """The saving state to carry through the loop (a JAX pytree).

    Attributes:
      chain_id: the collector's chain (int32 scalar).
      saved_samples: samples saved so far (int32 scalar).
      step: ``save`` calls so far (int32 scalar; counts the checkpoint interval).
    """

    chain_id: Any
    saved_samples: Any
    step: Any


class Checkpoint(NamedTuple):
    """What ``load`` returns: where a run was at its last checkpoint.

    Attributes:
      step: ``save`` calls made when it was written.
      saved_samples: samples saved by then.
      carry: the ``checkpoint=`` value of that ``save`` call (in ``init_checkpoint``'s
        structure, numpy leaves).
      data_state: a ``reference_data`` state continuing after that step (None
        without ``data=`` or when no chain position was saved).
      data_checkpoint: that chain position (``ReferenceData.get_state``'s dict), or None.
      arrays: the collector's arrays (``init_save(..., resume=...)`` uses them).
    """

    step: int
    saved_samples: int
    carry: Any
    data_state: Any
    data_checkpoint: Optional[dict]
    arrays: dict


def _checkpoint_file(directory: str, chain_id: int) -> str:
    return os.path.join(directory, f"chain_{chain_id}.ckpt.npz")


def _write_atomically(path: str, arrays: dict) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load(checkpoint_dir: str, init_checkpoint: Any = None, *, chain_id: int = 0,
         data: Any = None) -> Optional[Checkpoint]:
    """The last checkpoint of chain ``chain_id`` in ``checkpoint_dir``, or None if none.

    Args:
      checkpoint_dir: as given to ``save``.
      init_checkpoint: the carry's structure (leaves are taken from the file).
      chain_id: which chain's checkpoint.
      data: the ``reference_data`` whose chain the checkpoint holds; its restored
        state is ``data_state`` (without it, only ``data_checkpoint`` is set).
    """
    path = _checkpoint_file(checkpoint_dir, chain_id)
    if not os.path.exists(path):
        return None
    with np.load(path, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    meta = json.loads(str(arrays.pop("meta")))
    carry_leaves = [arrays.pop(f"carry:{i}") for i in range(meta["carry_leaves"])]
    carry = None
    if init_checkpoint is not None:
        carry = _unflatten(init_checkpoint, carry_leaves)
    data_state = None
    if meta["data"] is not None and data is not None:
        data_state = data.restore(meta["data"])
    return Checkpoint(meta["step"], meta["saved_samples"], carry, data_state, meta["data"], arrays)


class NoSaveState(NamedTuple):
    """``no_save``'s state: the samples kept so far, on the device (a JAX pytree).

    Attributes:
      chain_id: always 0 (JaxSGMC's field).
      saved_samples: samples kept so far (int32 scalar).
      data: the samples, each leaf with a leading axis of ``samples_collected``.
    """

    chain_id: Any
    saved_samples: Any
    data: Any


def no_save() -> tuple:
    """JaxSGMC's ``io.no_save``: keeps the samples in the device's memory, nothing on the host.

    For samples small enough to hold on the device: no host callback at all. The
    same three functions as ``save``.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> init_save, save_fn, postprocess_save = no_save()
      >>> state = init_save({"iteration": jnp.array(0)}, None, 3)
      >>> def update(state, it):
      ...     return save_fn(state, jnp.mod(it, 2) == 0, {"iteration": it})
      >>> state, _ = jax.lax.scan(update, state, jnp.arange(5))
      >>> out = postprocess_save(state, None)
      >>> int(out["sample_count"]), out["samples"]["iteration"].tolist()
      (3, [0, 2, 4])

    Returns:
      ``init_save(init_sample, unused_checkpoint, samples_collected)``,
      ``save(state, keep, sample, **unused) -> (state, None)`` (jit/scan; a kept
      sample past ``samples_collected`` is dropped, as JAX drops an
      out-of-bounds update), and ``postprocess_save(state, unused) ->
      {'sample_count', 'samples'}``.
    """
    import jax
    import jax.numpy as jnp

    def init_save(init_sample: Any, unused_checkpoint: Any, samples_collected: Any) -> NoSaveState:
        n = _count(samples_collected)
        data = jax.tree.map(lambda x: jnp.zeros((n,) + jnp.shape(x), jnp.asarray(x).dtype), init_sample)
        return NoSaveState(chain_id=0, saved_samples=jnp.int32(0), data=data)

    def save_fn(state: NoSaveState, keep: Any, sample: Any, **unused: Any) -> tuple:
        def kept(state: NoSaveState) -> NoSaveState:
            data = jax.tree.map(lambda d, x: d.at[state.saved_samples].set(x), state.data, sample)
            return NoSaveState(state.chain_id, state.saved_samples + 1, data)

        return jax.lax.cond(keep, kept, lambda state: state, state), None

    def postprocess_save(state: NoSaveState, unused: Any) -> dict:
        return {"sample_count": state.saved_samples, "samples": state.data}

    return init_save, save_fn, postprocess_save


def save(data_collector: Optional[DataCollector] = None, checkpoint_every: int = 0, *,
         checkpoint_dir: Optional[str] = None, data: Any = None) -> tuple:
    """JaxSGMC's ``io.save``: ``(init_save, save, postprocess_save)``, and checkpoints.

    Args:
      data_collector: where samples go (default: a new ``MemoryCollector``).
      checkpoint_every: write a checkpoint every this many ``save`` calls (0: never).
      checkpoint_dir: where checkpoints go (``chain_<id>.ckpt.npz``); needed with
        ``checkpoint_every``.
      data: the ``grainlike.reference_data`` whose chain position checkpoints hold
        (pass the chain's state as ``save(..., data_state=...)``).

    Returns:
      ``init_save(init_sample, init_checkpoint, samples_collected, resume=None)``
      (host, returns a ``SavingState``), ``save(state, keep, sample,
      checkpoint=None, data_state=None) -> (state, None)`` (jit/scan), and
      ``postprocess_save(state, unused) -> {'sample_count', 'samples'}`` (host,
      after the computation). ``postprocess_save`` (and ``init_save``) raise
      the exception a save or checkpoint callback caught, if any (see the
      module docstring).
    """
    collector = data_collector if data_collector is not None else MemoryCollector()
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be an int >= 0, got {checkpoint_every!r}")
    if checkpoint_every and checkpoint_dir is None:
        raise ValueError("save(checkpoint_every=...) needs checkpoint_dir=")
    templates: dict = {}  # chain id -> init_checkpoint
    received: dict = {}  # chain id -> samples this save's callbacks wrote (and resumed)
    errors = CallbackErrors("io.save")

    def init_save(init_sample: Any, init_checkpoint: Any, samples_collected: Any,
                  resume: Optional[Checkpoint] = None) -> SavingState:
        import jax.numpy as jnp

        errors.raise_pending()
        chain_id = collector.register_chain(init_sample, samples_collected)
        templates[chain_id] = init_checkpoint
        saved, step = 0, 0
        if resume is not None:
            collector.resume(chain_id, resume.saved_samples, resume.arrays)
            saved, step = resume.saved_samples, resume.step
        received[chain_id] = saved
        return SavingState(jnp.int32(chain_id), jnp.int32(saved), jnp.int32(step))

    def host_save(chain_id: Any, index: Any, *leaves: Any) -> np.ndarray:
        collector.save(int(chain_id), int(index), [np.asarray(x) for x in leaves])
        received[int(chain_id)] = received.get(int(chain_id), 0) + 1
        return np.int32(1)

    def host_checkpoint(chain_id: Any, step: Any, saved: Any, data_position: Any, *carry: Any) -> np.ndarray:
        chain_id, saved = int(chain_id), int(saved)
        data_checkpoint = None
        if data_position is not None and data is not None:
            data_checkpoint = data._checkpoint(*(int(x) for x in data_position))
        arrays = dict(collector.checkpoint(chain_id, saved))
        for i, leaf in enumerate(carry):
            arrays[f"carry:{i}"] = np.asarray(leaf)
        meta = {"step": int(step), "saved_samples": saved, "carry_leaves": len(carry),
                "data": data_checkpoint}
        arrays["meta"] = np.array(json.dumps(meta))
        _write_atomically(_checkpoint_file(checkpoint_dir, chain_id), arrays)
        return np.int32(0)

    def save_step(state: SavingState, keep: Any, sample: Any, checkpoint: Any = None,
                  data_state: Any = None, **unused: Any) -> tuple:
        import jax
        import jax.numpy as jnp

        errors.raise_pending()
        if data_state is not None and data is None and checkpoint_every:
            raise ValueError(
                "save(..., data_state=...) checkpoints a reference_data chain: pass that "
                "reference_data as io.save(..., data=...)"
            )
        one = jax.ShapeDtypeStruct((), jnp.int32)
        leaves = jax.tree.leaves(sample)
        # A failed save returns 0: the sample is not counted.
        saved = jax.lax.cond(
            keep,
            lambda: host_callback(errors, host_save, one, state.chain_id, state.saved_samples, *leaves)[1],
            lambda: jnp.int32(0),
        )
        step = state.step + 1
        if checkpoint_every:
            carry_leaves = jax.tree.leaves(checkpoint)
            position = None
            if data_state is not None:
                position = (data_state.chain, data_state.fill, data_state.line)
            jax.lax.cond(
                step % checkpoint_every == 0,
                lambda: host_callback(errors, host_checkpoint, one, state.chain_id, step,
                                      state.saved_samples + saved, position, *carry_leaves)[1],
                lambda: jnp.int32(0),
            )
        return SavingState(state.chain_id, state.saved_samples + saved, step), None

    def postprocess_save(state: SavingState, unused: Any = None) -> dict:
        import jax

        jax.block_until_ready(state)
        jax.effects_barrier()  # a checkpoint's callback has no output to wait on
        errors.raise_pending()
        chain_id, counted = int(state.chain_id), int(state.saved_samples)
        if counted > received.get(chain_id, 0):
            # JAX caches a traced function with the callbacks it was traced with: a
            # jitted update traced with an earlier io.save(...)'s save wrote there.
            raise RuntimeError(
                f"postprocess_save: the state counts {counted} saved samples of chain {chain_id}, "
                f"but this io.save(...) received {received.get(chain_id, 0)}: the jitted function "
                "that called save(...) was traced with the save of another io.save(...) call, and "
                "JAX reused that trace. Define (and jit) the update function after io.save(...), "
                "or pass save into it as an argument of a fresh jax.jit."
            )
        return {"sample_count": state.saved_samples, "samples": collector.finished(chain_id)}

    return init_save, save_step, postprocess_save

