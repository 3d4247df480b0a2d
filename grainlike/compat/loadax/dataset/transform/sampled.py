"""``loadax.dataset.transform.sampled``: items drawn with or without replacement."""

from __future__ import annotations

import threading
from typing import Any, Optional, TypeVar

from grainlike.compat.loadax.dataset.protocol import Dataset
from grainlike.compat.loadax.dataset.transform.shuffled import permutation

DatasetItem = TypeVar("DatasetItem")


class SampledDatasetWithoutReplacement(Dataset[DatasetItem]):
    """``sample_size`` items drawn without replacement, Loadax's way and draws.

    Each read ignores its index (beyond the bounds check) and takes the next
    draw: the last of the first ``sample_size`` positions of
    ``jax.random.permutation(subkey, len(dataset))``, then the one before, and
    so on; when they are used up, the key is split again for a new permutation.
    What an index gives therefore depends on how many reads came before it, as
    in Loadax: read with one worker for a reproducible order. grainlike's own
    API: ``grainlike.MapDataset.source(source).shuffle(seed)[:k]`` (the same
    items for an index, every time).

    Attributes:
      dataset: the dataset sampled.
      sample_size: the number of items.
      key: the JAX PRNG key, split at each new permutation.
    """

    def __init__(self, dataset: Dataset[DatasetItem], sample_size: int, key: Any):
        self.dataset = dataset
        self.sample_size = sample_size
        self.key = key
        self._pending: list = []  # the current permutation's positions not yet read
        self._lock = threading.Lock()  # reads come from the loader's threads

    def __len__(self) -> int:
        return self.sample_size

    def _next_index(self) -> Any:
        import jax
        import jax.numpy as jnp

        with self._lock:
            if not self._pending:
                self.key, subkey = jax.random.split(self.key)
                self._pending = list(permutation(subkey, len(self.dataset))[: self.sample_size])
            return jnp.asarray(self._pending.pop())

    def get(self, index: int) -> Optional[DatasetItem]:
        """The next drawn item; None for ``index >= sample_size`` or an empty dataset."""
        if index >= self.sample_size or len(self.dataset) == 0:
            return None
        return self.dataset.get(self._next_index())


class SampledDatasetWithReplacement(Dataset[DatasetItem]):
    """``sample_size`` items drawn with replacement, Loadax's way and draws.

    Each read splits the key and draws ``jax.random.randint(subkey, (), 0,
    len(dataset))``: what an index gives depends on how many reads came before
    it, as in Loadax. grainlike's own API: ``.sampler(grainlike.RandomSampler(
    len(source), num_samples=k, seed=seed))`` on the builder.

    Attributes:
      dataset: the dataset sampled.
      sample_size: the number of items.
      key: the JAX PRNG key, split at each read.
    """

    def __init__(self, dataset: Dataset[DatasetItem], sample_size: int, key: Any):
        self.dataset = dataset
        self.sample_size = sample_size
        self.key = key
        self._lock = threading.Lock()  # two reads never draw with one key

    def __len__(self) -> int:
        return self.sample_size

    def get(self, index: int) -> Optional[DatasetItem]:
        """A drawn item; None for ``index >= sample_size`` or an empty dataset."""
        if index >= self.sample_size or len(self.dataset) == 0:
            return None
        import jax

        with self._lock:
            self.key, subkey = jax.random.split(self.key)
        drawn = jax.random.randint(subkey, (), 0, len(self.dataset))
        return self.dataset.get(int(drawn))
