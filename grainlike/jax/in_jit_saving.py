"""Saving samples from inside ``jax.jit`` / ``lax.scan``, and resumable runs (JaxSGMC's ``io``).

``save(collector)`` returns JaxSGMC's three functions::

    init_save, save, postprocess_save = grainlike.io.save(MemoryCollector())
    state = init_save(init_sample, init_checkpoint, samples_collected)   # on the host
    state, _ = save(state, keep, sample)                                  # in jit/scan, per step
    out = postprocess_save(state, None)   # {'sample_count': ..., 'samples': ...}

``save`` sends a kept sample to the host with one ordered host callback
(``grainlike.jax.host_callbacks``), where the collector writes it
(``grainlike.jax.sample_collectors``). Beyond JaxSGMC: with ``checkpoint_every=N``
and a ``checkpoint_dir``, every N-th ``save`` call also writes a checkpoint
(atomically) of the step count, the samples so far, the user's carry and the
position of a ``reference_data`` chain; ``load`` and ``init_save(...,
resume=checkpoint)`` continue a crashed run so that it ends with the same samples
as an uninterrupted one. A failed save is not counted in ``saved_samples``; its
exception is raised by ``postprocess_save`` (or ``init_save``, a new trace of
``save``, or ``host_errors``). jax is imported when the functions are used.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, NamedTuple, Optional

import numpy as np

from grainlike.core.errors import check_int
from grainlike.jax.host_callbacks import CallbackErrors, host_callback
from grainlike.jax.pytree_dicts import (
    dict_to_pytree,
    pytree_dict_keys,
    pytree_to_dict,
    register_dictionize_rule,
)
from grainlike.jax.sample_collectors import DataCollector, HDF5Collector, MemoryCollector, samples_to_collect

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
        from jax import tree_util

        carry = tree_util.tree_unflatten(tree_util.tree_structure(init_checkpoint), carry_leaves)
    data_state = data.restore(meta["data"]) if meta["data"] is not None and data is not None else None
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
        n = samples_to_collect(samples_collected)
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
    checkpoint_every = check_int("checkpoint_every", checkpoint_every)
    if checkpoint_every and checkpoint_dir is None:
        raise ValueError("save(checkpoint_every=...) needs checkpoint_dir=")
    received: dict = {}  # chain id -> samples this save's callbacks wrote (and resumed)
    errors = CallbackErrors("io.save")

    def init_save(init_sample: Any, init_checkpoint: Any, samples_collected: Any,
                  resume: Optional[Checkpoint] = None) -> SavingState:
        import jax.numpy as jnp

        errors.raise_pending()
        chain_id = collector.register_chain(init_sample, samples_collected)
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
        data_checkpoint = None if data_position is None or data is None else data._checkpoint(
            *(int(x) for x in data_position))
        arrays = {**collector.checkpoint(chain_id, saved), **{f"carry:{i}": np.asarray(x) for i, x in enumerate(carry)}}
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
        # A failed save returns 0: the sample is not counted. The count is added as a
        # weakly typed 0 or 1, so it keeps the type of the state's count (int32 here,
        # a Python int's weak int32 in JaxSGMC's states).
        saved = jnp.where(jax.lax.cond(
            keep,
            lambda: host_callback(errors, host_save, one, state.chain_id, state.saved_samples, *leaves)[1],
            lambda: jnp.int32(0),
        ) == 1, 1, 0)
        step = state.step + 1
        if checkpoint_every:
            carry_leaves = jax.tree.leaves(checkpoint)
            position = None if data_state is None else (data_state.chain, data_state.fill, data_state.line)
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
