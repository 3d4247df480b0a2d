"""``jax_sgmc.data.tensorflow_loader``: a ``tf.data.Dataset`` as reference data (JaxSGMC 0.1.5's name).

The dataset is read once into memory by ``grainlike.sources.TfDataSource``
(TensorFlow is needed for that read only), and each chain shuffles it exactly
with grain's ``IndexSampler`` (a new permutation every epoch, seeded by the
chain's id), where JaxSGMC streams it through an unseeded shuffle buffer of
``shuffle_cache`` elements. So the batches have JaxSGMC's shapes and dtypes, not
its (unrepeatable) order.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as onp

from grainlike.compat.jax_sgmc.data.core import HostDataLoader
from grainlike.core.samplers import IndexSampler
from grainlike.core.sharding import NoSharding
from grainlike.sources.tf_data import TfDataSource

__all__ = ["TensorflowDataLoader"]

PyTree = Any


class TensorflowDataLoader(HostDataLoader):
    """A finite ``tf.data.Dataset`` of dicts (a ``tfds.load`` split), shuffled per chain.

    Args:
      pipeline: the dataset.
      mini_batch_size: deprecated in JaxSGMC; must be None.
      shuffle_cache: JaxSGMC's shuffle buffer size; unused (the shuffling is exact).
      exclude_keys: keys to drop (strings, which jitted code cannot take).

    Example:
      loader = TensorflowDataLoader(tfds.load("cifar10", split="train"), exclude_keys=["id"])
      init_fn, batch_fn, release = data.random_reference_data(loader, 100, 1000)
    """

    def __init__(self, pipeline: Any, mini_batch_size: Optional[int] = None, shuffle_cache: int = 100,
                 exclude_keys: Optional[List] = None):
        super().__init__()
        assert mini_batch_size is None, "Depreceated"
        self._source = TfDataSource(pipeline, exclude_keys=list(exclude_keys or ()))
        self._columns = self._source.columns
        self._observation_count = len(self._source)
        self._shuffle_cache = shuffle_cache
        self._chains: list = []  # [sampler, next position, cache_size, mb_size]
        self._lock = threading.Lock()

    def register_random_pipeline(self, cache_size: int = 1, mb_size: Optional[int] = None, **kwargs: Any) -> int:
        """A new chain of shuffled batches; its id (also its seed)."""
        assert kwargs == {}, "Tensorflow data loader does not accept additional kwargs"
        with self._lock:
            chain_id = len(self._chains)
            sampler = IndexSampler(self._observation_count, NoSharding(), shuffle=True, num_epochs=None,
                                   seed=chain_id)
            self._chains.append([sampler, 0, cache_size, mb_size])
        return chain_id

    def register_ordered_pipeline(self, cache_size: int = 1, mb_size: Optional[int] = None, **kwargs: Any) -> int:
        raise NotImplementedError

    def save_state(self, chain_id: int) -> Dict:
        return {"position": self._chains[chain_id][1]}

    def load_state(self, chain_id: int, data: Any) -> None:
        self._chains[chain_id][1] = int(data["position"])

    def get_batches(self, chain_id: int) -> Tuple[PyTree, None]:
        """``(batches, None)``: the chain's next ``cache_size`` batches, as device arrays."""
        batches, _ = self._host_batches(chain_id)
        return jax.tree.map(jnp.array, batches), None

    def _host_batches(self, chain_id: int) -> Tuple[PyTree, None]:
        chain = self._chains[chain_id]
        sampler, position, cache_size, mb_size = chain
        positions = onp.arange(position, position + cache_size * mb_size, dtype=onp.int64)
        keys = sampler.locate(positions).keys.reshape(cache_size, mb_size)
        chain[1] = position + cache_size * mb_size
        return jax.tree.map(lambda column: column[keys], self._columns), None

    @property
    def _format(self) -> PyTree:
        return jax.tree.map(lambda column: jax.ShapeDtypeStruct(dtype=column.dtype, shape=column.shape[1:]),
                            self._columns)

    @property
    def static_information(self) -> Dict:
        """``{"observation_count": n}``."""
        return {"observation_count": self._observation_count}
