"""``jax_sgmc.io``: saving samples inside jit-compiled functions (JaxSGMC 0.1.5's API).

``save(collector)`` is ``grainlike.io.save`` (``grainlike.jax.in_jit_saving``)
with JaxSGMC's state and collector protocol: each kept sample goes to the host by
one ordered callback and on to the collector's ``save(chain_id, leaves)``. Any
JAX pytree can be saved and comes back whole (``MemoryCollector``), its leaves
named by ``pytree_dict_keys`` (``HDF5Collector``, ``MemoryCollector(save_dir)``).
Checkpoints are JaxSGMC's: not supported (``grainlike.io.save`` has them).
"""

from __future__ import annotations

import abc
import json
import os
from collections import namedtuple
from typing import Any, Callable, NoReturn, Optional, Tuple, Union

import jax.numpy as jnp
import numpy as onp

from grainlike.jax import in_jit_saving, sample_collectors
from grainlike.jax.pytree_dicts import dict_to_pytree, pytree_dict_keys, pytree_to_dict, register_dictionize_rule

__all__ = [
    "DataCollector",
    "HDF5Collector",
    "JSONCollector",
    "MemoryCollector",
    "PyTree",
    "Saving",
    "dict_to_pytree",
    "load",
    "no_save",
    "pytree_dict_keys",
    "pytree_to_dict",
    "register_dictionize_rule",
    "save",
    "saving_state",
]

PyTree = Any

saving_state = namedtuple("saving_state", ["chain_id", "saved_samples", "data"])

Saving = Tuple[Callable[[PyTree, PyTree, PyTree], saving_state],
               Callable[[saving_state, jnp.bool_, PyTree, PyTree, PyTree], Union[Any, NoReturn]],
               Callable[[Any], Union[Any, NoReturn]]]


class DataCollector(metaclass=abc.ABCMeta):
    """Where saved samples go, on the host (JaxSGMC's protocol; one collector serves several chains)."""

    @abc.abstractmethod
    def register_data_loader(self, data_loader: Any) -> None:
        """Registers a data loader whose state checkpoints would hold."""

    @abc.abstractmethod
    def register_chain(self, init_sample: PyTree = None, init_checkpoint: PyTree = None,
                       static_information: PyTree = None) -> int:
        """Makes room for a chain's samples, shaped like ``init_sample``; the chain's id."""

    @abc.abstractmethod
    def save(self, chain_id: int, values: list) -> None:
        """Stores a sample: its leaves, in ``jax.tree.leaves`` order."""

    @abc.abstractmethod
    def finalize(self, chain_id: int) -> None:
        """Called once every sample of the chain has been saved."""

    @abc.abstractmethod
    def finished(self, chain_id: int) -> Any:
        """Called after ``finalize``; what ``postprocess_save`` reports as ``samples``."""

    @abc.abstractmethod
    def checkpoint(self, chain_id: int, state: Any) -> None:
        """Called every n-th step (checkpoints are not supported)."""

    @abc.abstractmethod
    def resume(self) -> Any:
        """Restores a checkpoint (not supported)."""


def _room(static_information: Any) -> Any:
    if static_information is None:
        raise ValueError("register_chain needs static_information (scheduler.static_information(samples_collected=n))")
    return static_information


class _JaxSgmcCollector(DataCollector):
    """A JaxSGMC collector over one of grainlike's (``grainlike.jax.sample_collectors``)."""

    def __init__(self, collector: sample_collectors.DataCollector):
        self._collector = collector
        self._counts: list = []

    def register_data_loader(self, data_loader: Any) -> None:
        """Nothing to register: checkpoints are not supported."""

    def _register(self, init_sample: PyTree, static_information: Any) -> int:
        chain_id = self._collector.register_chain(init_sample, _room(static_information))
        self._counts.append(0)
        return chain_id

    def save(self, chain_id: int, values: list) -> None:
        """Stores the next sample of ``chain_id``: its leaves, in ``jax.tree.leaves`` order."""
        chain_id = int(chain_id)
        self._collector.save(chain_id, self._counts[chain_id], [onp.asarray(v) for v in values])
        self._counts[chain_id] += 1

    def checkpoint(self, chain_id: int, state: Any) -> None:
        """Nothing: checkpoints are not supported."""

    def resume(self) -> None:
        """Nothing: checkpoints are not supported."""


class MemoryCollector(_JaxSgmcCollector):
    """Samples in numpy arrays in RAM, returned by ``postprocess_save`` in the sample's tree structure.

    Args:
      save_dir: also write each chain's samples to ``save_dir/chain_<id>.npz``, one
        entry per leaf named by its ``pytree_dict_keys`` path joined with ``/``.
    """

    def __init__(self, save_dir: Optional[str] = None):
        super().__init__(sample_collectors.MemoryCollector(save_dir=save_dir))
        self._samples: dict = {}

    def register_chain(self, init_sample: PyTree = None, static_information: Any = None,
                       **unused_kwargs: Any) -> int:
        """Makes room for ``static_information.samples_collected`` samples shaped like ``init_sample``."""
        assert init_sample is not None, "Need a sample-pytree to allocate memory."
        return self._register(init_sample, static_information)

    def finalize(self, chain_id: int) -> None:
        """Writes the ``.npz`` file, with ``save_dir``."""
        self._samples[int(chain_id)] = self._collector.finished(int(chain_id))

    def finished(self, chain_id: int) -> Any:
        """The samples, in the sample's tree structure with numpy arrays as leaves."""
        return self._samples[int(chain_id)]


class HDF5Collector(_JaxSgmcCollector):
    """Samples written into an open ``h5py.File``: dataset ``/chain~<id>/<key path>`` per leaf.

    ``postprocess_save`` reports ``samples`` None: they are in the file.

    Example:
      >>> import tempfile
      >>> import h5py
      >>> file = h5py.File(tempfile.TemporaryFile(), "w")
      >>> init_save, save_fn, postprocess_save = save(HDF5Collector(file))
      >>> file.close()
    """

    def __init__(self, file: Any):
        super().__init__(sample_collectors.HDF5Collector(file))

    def register_chain(self, init_sample: PyTree = None, init_checkpoint: PyTree = None,
                       static_information: Any = None) -> int:
        """Creates a dataset per leaf of ``init_sample``, ``samples_collected`` long."""
        assert init_sample is not None, "Need a sample-pytree to allocate memory."
        assert init_checkpoint is not None, "Need a checkpoint-pytree to allocate memory."
        return self._register(init_sample, static_information)

    def finalize(self, chain_id: int) -> None:
        """Flushes the file."""
        self._collector.finished(int(chain_id))

    def finished(self, chain_id: int) -> None:
        """None: the samples are in the file."""
        return None


class JSONCollector(DataCollector):
    """Samples written as JSON lists: ``dir/chain_<id>_iteration_<n>.json`` after ``n`` samples.

    Args:
      dir: the folder (created if missing).
      write_frequency: also write a file every this many samples (0: only at the end).
    """

    def __init__(self, dir: str, write_frequency: int = 0):
        os.makedirs(dir, exist_ok=True)
        self._dir = dir
        self._samples: list = []
        self._write_frequency = write_frequency

    def register_data_loader(self, data_loader: Any) -> None:
        raise NotImplementedError("Checkpointing is not supported by JSON loader.")

    def register_chain(self, init_sample: PyTree = None, init_checkpoint: PyTree = None,
                       static_information: PyTree = None) -> int:
        self._samples.append([])
        return len(self._samples) - 1

    def save(self, chain_id: int, values: list) -> None:
        samples = self._samples[int(chain_id)]
        samples.append([onp.array(v) for v in values])
        if self._write_frequency > 0 and len(samples) % self._write_frequency == 0:
            self._write(int(chain_id))

    def finalize(self, chain_id: int) -> None:
        if self._samples[int(chain_id)]:
            self._write(int(chain_id))

    def checkpoint(self, chain_id: int, state: Any) -> None:
        raise NotImplementedError("Checkpointing is not supported by JSON loader.")

    def resume(self) -> None:
        raise NotImplementedError("Checkpointing is not supported by JSON loader.")

    def _write(self, chain_id: int) -> None:
        samples = self._samples[chain_id]
        # A list per leaf, its samples stacked (compact, as ujson writes).
        stacked = [onp.stack(leaf).tolist() for leaf in zip(*samples)]
        path = os.path.join(self._dir, f"chain_{chain_id}_iteration_{len(samples)}.json")
        with open(path, "w") as f:
            json.dump(stacked, f, separators=(",", ":"))

    def finished(self, chain_id: int) -> None:
        return None


class _JaxSGMCCollector(sample_collectors.DataCollector):
    """grainlike's collector protocol over a collector of JaxSGMC's (``DataCollector`` above)."""

    def __init__(self, collector: DataCollector):
        self._collector = collector
        self.init_checkpoint: Any = None  # the one of the init_save being run

    def register_chain(self, init_sample: Any, samples_collected: Any) -> int:
        return self._collector.register_chain(init_sample=init_sample, init_checkpoint=self.init_checkpoint,
                                              static_information=samples_collected)

    def save(self, chain_id: int, index: int, leaves: list) -> None:
        self._collector.save(chain_id, leaves)

    def checkpoint(self, chain_id: int, count: int) -> dict:
        raise NotImplementedError("Checkpointing is not supported yet.")

    def resume(self, chain_id: int, count: int, arrays: dict) -> None:
        raise NotImplementedError("Checkpointing is not supported yet.")

    def finished(self, chain_id: int) -> Any:
        self._collector.finalize(chain_id)
        return self._collector.finished(chain_id)


def load(init_state: Any, checkpoint: Any) -> NoReturn:
    """Not supported, as in JaxSGMC: ``grainlike.io.save(..., checkpoint_every=...)`` and ``grainlike.io.load`` are."""
    raise NotImplementedError("Checkpointing is currently not supported.")


def save(data_collector: Optional[DataCollector] = None, checkpoint_every: int = 0) -> Saving:
    """Saving of samples inside jit: ``(init_save, save, postprocess_save)``.

    ``init_save(init_sample, init_checkpoint, static_information)`` registers a
    chain; ``save(state, keep, sample)`` (inside jit / scan) sends the sample to
    the collector when ``keep``; ``postprocess_save(state, None)`` waits for the
    saves and returns ``{'sample_count': ..., 'samples': collector.finished(...)}``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jax.lax import scan
      >>> from grainlike.compat.jax_sgmc import scheduler
      >>> init_save, save_fn, postprocess_save = save(MemoryCollector())
      >>> def update(state, it):
      ...     return save_fn(state, jnp.mod(it, 2) == 0, {'iteration': it})
      >>> state = init_save({'iteration': jnp.array(0)}, {}, scheduler.static_information(samples_collected=3))
      >>> final_state, _ = scan(update, state, jnp.arange(5))
      >>> print(postprocess_save(final_state, None))
      {'sample_count': Array(3, dtype=int32, weak_type=True), 'samples': {'iteration': array([0, 2, 4], dtype=int32)}}

    Args:
      data_collector: where the samples go (default: a new ``MemoryCollector``).
      checkpoint_every: must be 0: checkpoints are not supported.
    """
    if checkpoint_every != 0:
        raise NotImplementedError("Checkpointing is not supported yet.")
    collector = _JaxSGMCCollector(MemoryCollector() if data_collector is None else data_collector)
    grain_init, grain_save, grain_postprocess = in_jit_saving.save(collector)

    def init(init_sample: PyTree, init_checkpoint: PyTree, static_information: Any) -> saving_state:
        collector.init_checkpoint = init_checkpoint
        try:
            state = grain_init(init_sample, init_checkpoint, static_information)
        finally:
            collector.init_checkpoint = None
        return saving_state(chain_id=int(state.chain_id), saved_samples=0, data=None)

    def save_fn(state: saving_state, keep: Any, sample: Any, scheduler_state: Any = None,
                solver_state: Any = None) -> tuple:
        new, _ = grain_save(in_jit_saving.SavingState(state.chain_id, state.saved_samples, 0), keep, sample)
        return saving_state(chain_id=state.chain_id, saved_samples=new.saved_samples, data=None), None

    def postprocess(state: saving_state, unused_saved: Any) -> dict:
        return grain_postprocess(in_jit_saving.SavingState(state.chain_id, state.saved_samples, 0))

    return init, save_fn, postprocess


def no_save() -> Saving:
    """Samples kept in the device's memory: the three functions of ``save``, no host callback.

    Example:
      >>> import jax.numpy as jnp
      >>> from jax.lax import scan
      >>> from grainlike.compat.jax_sgmc import scheduler
      >>> init_save, save_fn, postprocess_save = no_save()
      >>> def update(state, it):
      ...     return save_fn(state, jnp.mod(it, 2) == 0, {'iteration': it})
      >>> state = init_save({'iteration': jnp.array(0)}, None, scheduler.static_information(samples_collected=3))
      >>> final_state, _ = scan(update, state, jnp.arange(5))
      >>> print(postprocess_save(final_state, None))
      {'sample_count': Array(3, dtype=int32, weak_type=True), 'samples': {'iteration': Array([0, 2, 4], dtype=int32)}}
    """
    grain_init, grain_save, _ = in_jit_saving.no_save()

    def init(init_sample: PyTree, unused_solver_state: PyTree, static_information: Any) -> saving_state:
        state = grain_init(init_sample, None, static_information)
        return saving_state(chain_id=0, saved_samples=0, data=state.data)

    def save_fn(state: saving_state, keep: Any, sample: Any, **unused_kwargs: Any) -> tuple:
        new, _ = grain_save(in_jit_saving.NoSaveState(state.chain_id, state.saved_samples, state.data), keep, sample)
        return saving_state(chain_id=new.chain_id, saved_samples=new.saved_samples, data=new.data), None

    def postprocess(state: saving_state, unused_saved: Any) -> dict:
        return {"sample_count": state.saved_samples, "samples": state.data}

    return init, save_fn, postprocess

