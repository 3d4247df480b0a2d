"""``jax_sgmc.data.numpy_loader``: datasets of numpy arrays (JaxSGMC 0.1.5's loaders and draws).

``NumpyDataLoader`` draws JaxSGMC's batches: each chain has its own numpy
generator, ``default_rng(SeedSequence(seed).spawn(1)[0])`` with ``seed`` the
chain's number unless given, and the same three modes (draws with replacement;
shuffling without replacement, reshuffled as the drawn permutations run out;
epochs whose last batch is filled up with masked observations). Its chains are
fed to jitted code by ``data.random_reference_data`` / ``full_reference_data``.
"""

from __future__ import annotations

import copy
import math
import threading
from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as onp
from jax import random

from grainlike.compat.jax_sgmc.data.core import (
    DataLoader,
    DeviceDataLoader,
    HostDataLoader,
    MiniBatchInformation,
    tree_index,
)

__all__ = ["DeviceNumpyDataLoader", "NumpyBase", "NumpyDataLoader"]

PyTree = Any


class NumpyBase(DataLoader):
    """Arrays given as keyword arguments, equally long along their first axis."""

    def __init__(self, on_device: bool = True, copy: bool = True, **reference_data: Any):
        super().__init__()
        self._reference_data = {
            name: jnp.array(array, copy=copy) if on_device else onp.array(array, copy=copy)
            for name, array in reference_data.items()
        }
        counts = [len(array) for array in reference_data.values()]
        if counts and any(c != counts[0] for c in counts):
            raise ValueError("All reference_data arrays must have the same length in the first dimension.")
        self._observation_count = counts[0] if counts else 0

    @property
    def reference_data(self) -> Dict:
        """The arrays, a dict."""
        return self._reference_data

    @property
    def _format(self) -> PyTree:
        return {name: jax.ShapeDtypeStruct(dtype=array.dtype, shape=tuple(int(s) for s in array.shape[1:]))
                for name, array in self._reference_data.items()}

    @property
    def static_information(self) -> Dict:
        """``{"observation_count": n}``."""
        return {"observation_count": self._observation_count}


class DeviceNumpyDataLoader(NumpyBase, DeviceDataLoader):
    """Arrays kept on the device, drawn from with ``jax.random`` inside jit (one batch per draw).

    Example:
      >>> import numpy as onp
      >>> loader = DeviceNumpyDataLoader(name_for_x=onp.arange(10), name_for_y=onp.zeros((10, 4, 3)))
      >>> for key, value in loader.initializer_batch(4).items():
      ...     print(f"{key}: shape={value.shape}, dtype={value.dtype}")
      name_for_x: shape=(4,), dtype=int32
      name_for_y: shape=(4, 4, 3), dtype=float32
    """

    def __init__(self, copy: bool = True, **reference_data: Any):
        super().__init__(on_device=True, copy=copy, **reference_data)

    def init_random_data(self, *args: Any, **kwargs: Any) -> PyTree:
        """A chain's PRNG key: ``key=`` or ``PRNGKey(0)``."""
        return kwargs.get("key", random.PRNGKey(0))

    def get_random_data(self, state: Any, batch_size: int) -> Tuple[PyTree, Tuple[PyTree, MiniBatchInformation]]:
        """``(key, (batch, info))``: ``batch_size`` observations drawn with replacement."""
        key, split = random.split(state)
        indices = random.randint(split, shape=(batch_size,), minval=0, maxval=self._observation_count)
        info = MiniBatchInformation(observation_count=self._observation_count, batch_size=batch_size,
                                    mask=jnp.ones(batch_size, dtype=jnp.bool_))
        return key, (tree_index(self._reference_data, indices), info)

    def get_full_data(self) -> Dict:
        return self._reference_data


class NumpyDataLoader(NumpyBase, HostDataLoader):
    """Arrays kept in host memory; each chain draws its batches with its own numpy generator.

    Example:
      >>> import numpy as onp
      >>> loader = NumpyDataLoader(name_for_x=onp.arange(10), name_for_y=onp.zeros((10, 4, 3)))
      >>> for key, value in loader.initializer_batch(4).items():
      ...     print(f"{key}: shape={value.shape}, dtype={value.dtype}")
      name_for_x: shape=(4,), dtype=int32
      name_for_y: shape=(4, 4, 3), dtype=float32

    Args:
      copy: copy the arrays (default) or keep references to them.
      reference_data: each keyword's array is that key of the batches.
    """

    def __init__(self, copy: bool = True, **reference_data: Any):
        super().__init__(on_device=False, copy=copy, **reference_data)
        self._chains: List[dict] = []
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"]  # a new one after unpickling
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def register_random_pipeline(self, cache_size: int = 1, mb_size: Optional[int] = None, in_epochs: bool = False,
                                 shuffle: bool = False, **kwargs: Any) -> int:
        """A new chain of random batches; its id.

        Args:
          cache_size: batches per ``get_batches``.
          mb_size: observations per batch.
          shuffle: draw without replacement (permutations of the data) instead of
            independently.
          in_epochs: with ``shuffle``, end each epoch with a batch filled up with
            masked observations instead of running into the next permutation.
          seed: the chain's seed (default: the chain's id).
        """
        if mb_size > self._observation_count:
            raise ValueError(f"The batch size cannot be bigger than the observation count. Provided {mb_size} "
                             f"and {self._observation_count}")
        if not shuffle and in_epochs:
            raise ValueError("in_epochs = True can only be used for shuffle = True.")
        with self._lock:
            chain_id = len(self._chains)
            seed = kwargs.get("seed", chain_id)
            self._chains.append({
                "type": "random",
                "rng": onp.random.default_rng(onp.random.SeedSequence(seed).spawn(1)[0]),
                "idx_offset": None,
                "in_epochs": in_epochs,
                "shuffle": shuffle,
                "remaining_samples": 0,
                # An epoch chain starts as if its last epoch had just ended.
                "draws": math.ceil(self._observation_count / mb_size),
                "random_indices": None,
                "mb_size": mb_size,
                "cache_size": cache_size,
            })
        return chain_id

    def register_ordered_pipeline(self, cache_size: int = 1, mb_size: Optional[int] = None, **kwargs: Any) -> int:
        """A new chain of batches in the order of the observations; its id."""
        if mb_size > self._observation_count:
            raise ValueError(f"The batch size cannot be bigger than the observation count. Provided {mb_size} "
                             f"and {self._observation_count}")
        with self._lock:
            chain_id = len(self._chains)
            self._chains.append({"type": "ordered", "rng": None, "idx_offset": 0, "mb_size": mb_size,
                                 "cache_size": cache_size})
        return chain_id

    def save_state(self, chain_id: int) -> PyTree:
        """What ``load_state`` needs to put the chain back where it is now."""
        chain = self._chains[chain_id]
        if chain["type"] == "ordered":
            return {"ordered": chain["idx_offset"]}
        # The index arrays are replaced, never changed in place: sharing them is safe.
        data = {key: value for key, value in chain.items() if key != "rng"}
        return {"random": (copy.deepcopy(chain["rng"].bit_generator.state), data)}

    def load_state(self, chain_id: int, data: Any) -> None:
        """Puts the chain back where ``save_state`` saw it."""
        ((kind, value),) = data.items()
        chain = self._chains[chain_id]
        if kind == "random":
            rng_state, chain_data = value
            chain["rng"].bit_generator.state = copy.deepcopy(rng_state)
            chain.update(chain_data)
        elif kind == "ordered":
            chain["idx_offset"] = value
        else:
            raise ValueError(f"Chain type {kind} is unknown.")

    def get_batches(self, chain_id: int) -> PyTree:
        """``(batches, mask)``: the chain's next ``cache_size`` batches, as device arrays."""
        batches, mask = self._host_batches(chain_id)
        return jax.tree.map(jnp.array, batches), jnp.array(mask, dtype=jnp.bool_)

    def _host_batches(self, chain_id: int) -> Tuple[PyTree, onp.ndarray]:
        indices, mask = self._indices(chain_id)
        return {key: data[indices] for key, data in self._reference_data.items()}, mask

    def _indices(self, chain_id: int) -> Tuple[onp.ndarray, onp.ndarray]:
        """``(indices, mask)``, both ``(cache_size, mb_size)``: the chain's next batches."""
        chain = self._chains[chain_id]
        if chain["type"] == "ordered":
            draw = self._ordered_indices
        elif chain["in_epochs"]:
            draw = self._shuffle_in_epochs
        elif chain["shuffle"]:
            draw = self._shuffle_indices
        else:
            draw = self._draw_indices
        drawn = [draw(chain) for _ in range(chain["cache_size"])]
        return onp.array([i for i, _ in drawn]), onp.array([m for _, m in drawn], dtype=onp.bool_)

    def _ordered_indices(self, chain: dict) -> tuple:
        size, offset, n = chain["mb_size"], chain["idx_offset"], self._observation_count
        positions = onp.arange(size) + offset
        # The last batch is filled up with the first observations, masked.
        chain["idx_offset"] = 0 if offset + size >= n else offset + size
        return onp.mod(positions, n), positions < n

    def _draw_indices(self, chain: dict) -> tuple:
        size = chain["mb_size"]
        drawn = chain["rng"].choice(onp.arange(0, self._observation_count), size=size, replace=True)
        return drawn, onp.ones(size, dtype=onp.bool_)

    def _permutation(self, chain: dict) -> onp.ndarray:
        n = self._observation_count
        return chain["rng"].choice(onp.arange(0, n), size=n, replace=False)

    def _shuffle_indices(self, chain: dict) -> tuple:
        size, n = chain["mb_size"], self._observation_count
        # A ring of whole batches that holds a permutation and the rest of the one before.
        ring_batches = n // size + 2
        ring = ring_batches * size
        if chain["remaining_samples"] < size:
            if chain["random_indices"] is None:
                chain["draws"] = 0
                indices = onp.zeros(ring, dtype=onp.int_)
            else:
                indices = chain["random_indices"].copy()
            # The next permutation goes after the indices not yet drawn.
            start = chain["draws"] * size + chain["remaining_samples"]
            indices[onp.mod(onp.arange(n) + start, ring)] = self._permutation(chain)
            chain["random_indices"] = indices
            chain["remaining_samples"] += n
        selected = chain["random_indices"][onp.mod(onp.arange(size) + chain["draws"] * size, ring)]
        chain["draws"] = (chain["draws"] + 1) % ring_batches
        chain["remaining_samples"] -= size
        return selected, onp.ones(size, dtype=onp.bool_)

    def _shuffle_in_epochs(self, chain: dict) -> tuple:
        size, n = chain["mb_size"], self._observation_count
        epoch_batches = math.ceil(n / size)
        if chain["draws"] == epoch_batches:
            # Positions past the data keep their first value (0): masked fillers.
            indices = (onp.zeros(epoch_batches * size, dtype=onp.int_) if chain["random_indices"] is None
                       else chain["random_indices"].copy())
            indices[:n] = self._permutation(chain)
            chain["random_indices"] = indices
            chain["draws"] = 0
        start = size * chain["draws"]
        chain["draws"] += 1
        return chain["random_indices"][start:start + size].copy(), onp.arange(start, start + size) < n
