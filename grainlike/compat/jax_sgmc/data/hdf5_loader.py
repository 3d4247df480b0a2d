"""``jax_sgmc.data.hdf5_loader``: samples saved by ``io.HDF5Collector`` as reference data (JaxSGMC 0.1.5)."""

from __future__ import annotations

from typing import Any, Tuple

import jax
import numpy as onp

from grainlike.compat.jax_sgmc.data.numpy_loader import NumpyDataLoader
from grainlike.jax.pytree_dicts import pytree_dict_keys

__all__ = ["HDF5Loader"]

PyTree = Any


class HDF5Loader(NumpyDataLoader):
    """Reads the datasets an ``HDF5Collector`` wrote, drawn from as a ``NumpyDataLoader`` draws.

    Args:
      file: an open ``h5py.File`` or the path of one (opened read-only).
      subdir: the group of the saved (sub)tree, e.g. ``"/chain~0/"``.
      sample: a pytree of the saved (sub)tree's structure: the batches have it,
        each leaf read from the dataset its ``pytree_dict_keys`` path names.

    Example:
      >>> import tempfile, h5py, numpy as onp
      >>> file = h5py.File(tempfile.TemporaryFile(), "w")
      >>> file["/chain~0/w"] = onp.arange(6.0).reshape(3, 2)
      >>> loader = HDF5Loader(file, subdir="/chain~0/", sample={"w": onp.zeros(2)})
      >>> loader.static_information
      {'observation_count': 3}
      >>> file.close()
    """

    def __init__(self, file: Any, subdir: str = "/chain~0/variables/", sample: PyTree = None):
        import h5py

        super().__init__()
        self._dataset = file if isinstance(file, h5py.File) else h5py.File(name=file, mode="r")
        self._leaf_names = ["/".join([subdir.rstrip("/")] + [str(k) for k in path])
                            for path in pytree_dict_keys(sample)]
        self._structure = jax.tree.structure(sample)
        self._sample_format = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(shape=leaf.shape, dtype=leaf.dtype),
                                           sample)
        self._observation_count = len(self._dataset[self._leaf_names[0]])

    @property
    def _format(self) -> PyTree:
        return self._sample_format

    def _host_batches(self, chain_id: int) -> Tuple[PyTree, onp.ndarray]:
        indices, mask = self._indices(chain_id)
        # HDF5 reads take increasing, distinct indices: each batch reads its distinct
        # indices and puts them in the drawn order.
        distinct = [onp.unique(batch, return_inverse=True) for batch in indices]
        leaves = [onp.stack([self._dataset[name][unique][inverse] for unique, inverse in distinct])
                  for name in self._leaf_names]
        return jax.tree.unflatten(self._structure, leaves), mask

    def close(self) -> None:
        """Closes the HDF5 file."""
        self._dataset.close()
