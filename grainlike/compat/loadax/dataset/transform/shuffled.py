"""``loadax.dataset.transform.shuffled``: a dataset in the order of a JAX permutation."""

from __future__ import annotations

from typing import Any, Optional, Sequence, TypeVar

import numpy as np

from grainlike.compat.loadax.dataset.protocol import Dataset

DatasetItem = TypeVar("DatasetItem")


class JaxIndices(Sequence):
    """A permutation's positions as JAX int scalars, made when read.

    Loadax keeps ``list(jax.random.permutation(key, n))``, n device scalars built
    up front (seconds for a million items); this holds the permutation as one
    host array and gives the same scalars, one per read.
    """

    def __init__(self, order: np.ndarray):
        self._order = order

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, position: Any) -> Any:
        import jax.numpy as jnp

        if isinstance(position, slice):
            return [jnp.asarray(i) for i in self._order[position]]
        return jnp.asarray(self._order[position])

    def __repr__(self) -> str:
        return f"JaxIndices({self._order.tolist()!r:.200})"


def permutation(key: Any, size: int) -> np.ndarray:
    """``jax.random.permutation(key, size)`` on the host: Loadax's draw."""
    import jax

    return np.asarray(jax.random.permutation(key, size))


class ShuffledDataset(Dataset[DatasetItem]):
    """The items in the order ``jax.random.permutation(key, len(dataset))``, Loadax's draw.

    Item ``i`` is ``dataset.get(indices[i])``, with the index a JAX int scalar as
    in Loadax (so a ``RangeDataset`` under it gives JAX scalars too). The order is
    drawn once: every pass reads the same order. grainlike's own API shuffles with
    ``.shuffle(seed)``: a new order every epoch, restorable from a checkpoint.

    Example:
      >>> import jax
      >>> from grainlike.compat.loadax import InMemoryDataset
      >>> [int(x) for x in ShuffledDataset(InMemoryDataset([1, 2, 3, 4, 5]), jax.random.PRNGKey(0))]
      [1, 2, 5, 4, 3]

    Args:
      dataset: the dataset shuffled.
      key: a JAX PRNG key. Loadax 0.2.1 requires it (its README's
        ``ShuffledDataset(RangeDataset(0, 10))`` raises ``TypeError`` there); here it
        defaults to ``jax.random.PRNGKey(0)``.

    Attributes:
      dataset: the dataset shuffled.
      key: the key.
      indices: the permuted indices, a sequence of JAX int scalars.
    """

    def __init__(self, dataset: Dataset[DatasetItem], key: Any = None):
        if key is None:
            import jax

            key = jax.random.PRNGKey(0)
        self.dataset = dataset
        self.key = key
        self.indices: Sequence = JaxIndices(permutation(key, len(dataset)))

    def __len__(self) -> int:
        return len(self.dataset)

    def get(self, index: int) -> Optional[DatasetItem]:
        """``dataset.get(indices[index])``; None for a negative or too large index."""
        if index < 0 or index >= len(self.indices):
            return None
        return self.dataset.get(self.indices[index])

    def __repr__(self) -> str:
        return f"ShuffledDataset(dataset={self.dataset})"
