"""Where samples saved inside jit (``grainlike.io.save``) go, on the host: ``MemoryCollector``, ``HDF5Collector``."""

from __future__ import annotations

import abc
import os
import threading
from typing import Any, Optional

import numpy as np

from grainlike.core.errors import is_int
from grainlike.jax.pytree_dicts import pytree_dict_keys

__all__ = ["DataCollector", "HDF5Collector", "MemoryCollector", "samples_to_collect"]


def samples_to_collect(samples_collected: Any) -> int:
    """An int, or the ``samples_collected`` attribute of JaxSGMC's ``scheduler.static_information``."""
    n = getattr(samples_collected, "samples_collected", samples_collected)
    if not is_int(n) or n < 0:
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


def _leaves(tree: Any) -> list:
    from jax import tree_util

    return tree_util.tree_leaves(tree)


def _unflatten(template: Any, leaves: list) -> Any:
    """``template``'s pytree (JAX's tree structure) with ``leaves``, in ``jax.tree.leaves`` order."""
    from jax import tree_util

    return tree_util.tree_unflatten(tree_util.tree_structure(template), leaves)


def _leaf_names(template: Any) -> list:
    """Each leaf's name: its key path in ``pytree_to_dict(template)`` joined with ``/``."""
    return ["/".join(map(str, path)) for path in pytree_dict_keys(template)]


class _ArraysCollector(DataCollector):
    """Each chain's samples in one array per leaf (``jax.tree.leaves`` order), leading axis ``samples_collected``.

    Any JAX pytree can be saved: the arrays go back into the sample's own tree
    structure, so namedtuples, registered dataclasses and nodes with or without a
    dictionize rule come back whole. ``_allocate`` makes the arrays.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrays: list = []
        self._templates: list = []

    def register_chain(self, init_sample: Any, samples_collected: int) -> int:
        n = samples_to_collect(samples_collected)
        with self._lock:
            chain_id = len(self._arrays)
            self._arrays.append(self._allocate(chain_id, init_sample, n))
            self._templates.append(init_sample)
            return chain_id

    def _allocate(self, chain_id: int, init_sample: Any, n: int) -> list:
        raise NotImplementedError

    def save(self, chain_id: int, index: int, leaves: list) -> None:
        arrays = self._arrays[chain_id]
        if arrays and index >= arrays[0].shape[0]:
            raise IndexError(
                f"{type(self).__name__}: chain {chain_id} got sample {index + 1}, more than the "
                f"samples_collected={arrays[0].shape[0]} made room for"
            )
        for array, leaf in zip(arrays, leaves):
            array[index] = leaf


class MemoryCollector(_ArraysCollector):
    """Samples in numpy arrays in RAM; with ``save_dir``, also ``chain_<id>.npz`` files.

    The arrays are allocated for ``samples_collected`` samples up front; rows after
    the last saved sample stay zero (``sample_count`` says how many are real).
    """

    def __init__(self, save_dir: Optional[str] = None):
        super().__init__()
        self._dir = save_dir

    def _allocate(self, chain_id: int, init_sample: Any, n: int) -> list:
        return [np.zeros((n,) + np.shape(x), np.asarray(x).dtype) for x in _leaves(init_sample)]

    def _names(self, chain_id: int) -> list:
        return [name or "sample" for name in _leaf_names(self._templates[chain_id])]

    def checkpoint(self, chain_id: int, count: int) -> dict:
        return {f"sample:{name}": a[:count] for name, a in zip(self._names(chain_id), self._arrays[chain_id])}

    def resume(self, chain_id: int, count: int, arrays: dict) -> None:
        for name, a in zip(self._names(chain_id), self._arrays[chain_id]):
            a[:count] = arrays[f"sample:{name}"]

    def finished(self, chain_id: int) -> Any:
        samples = self._arrays[chain_id]
        if self._dir:
            os.makedirs(self._dir, exist_ok=True)
            np.savez(os.path.join(self._dir, f"chain_{chain_id}.npz"),
                     **dict(zip(self._names(chain_id), samples)))
        return _unflatten(self._templates[chain_id], samples)


class HDF5Collector(_ArraysCollector):
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
        super().__init__()
        self._file = file

    def _allocate(self, chain_id: int, init_sample: Any, n: int) -> list:
        return [self._file.require_dataset(f"/chain~{chain_id}/{name}".rstrip("/"), shape=(n,) + np.shape(leaf),
                                           dtype=np.asarray(leaf).dtype)
                for name, leaf in zip(_leaf_names(init_sample), _leaves(init_sample))]

    def checkpoint(self, chain_id: int, count: int) -> dict:
        self._file.flush()
        return {}

    def resume(self, chain_id: int, count: int, arrays: dict) -> None:
        pass  # the samples are in the file

    def finished(self, chain_id: int) -> Any:
        self._file.flush()
        return _unflatten(self._templates[chain_id], self._arrays[chain_id])
