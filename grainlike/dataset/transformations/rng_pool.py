"""``RngPool``: grain's pool of reusable random generators, one stream per index.

The stream of ``(op_seed, index)`` is ``Philox(seed)`` from counter ``(0, 0, op_seed,
index)``, what grain's random maps give the element at ``index``. Resetting a pooled
generator costs far less than building one (~10 us), and resetting it from a state
dict of this thread's own, whose counter is changed in place, costs less than
building the dict each time (the setter copies what it reads): 1.2 us instead of
1.9 us per acquire and release.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from grainlike.core.record import philox_state


class RngPool:
    """Generators over ``Philox(seed)``, reused across indices; thread-safe.

    Example:
      >>> pool = RngPool(seed=42)
      >>> rng = pool.acquire_rng(7)
      >>> first = rng.integers(1000)
      >>> pool.release_rng(rng)
      >>> int(pool.acquire_rng(7).integers(1000)) == int(first)
      True
    """

    def __init__(self, seed: Any):
        self._seed = seed
        self._key: Any = None  # Philox(seed)'s key, known once a generator is built.
        # list.pop / list.append are atomic: threads share the pool without a lock.
        self._free: list = []
        # Per thread: (Philox state dict, its counter array), reused by every acquire.
        self._local = threading.local()

    def __reduce__(self):
        # The pooled generators are a cache: a copy starts empty.
        return (RngPool, (self._seed,))

    def acquire_rng(self, index: int, *, op_seed: int = 0) -> np.random.Generator:
        """A generator positioned at the start of stream ``(op_seed, index)``."""
        try:
            rng = self._free.pop()
        except IndexError:
            rng = np.random.Generator(np.random.Philox(self._seed))
            self._key = rng.bit_generator.state["state"]["key"]
        try:
            state, counter = self._local.template
        except AttributeError:
            counter = np.zeros(4, np.uint64)
            state = philox_state(self._key, counter)
            self._local.template = (state, counter)
        counter[2] = op_seed
        counter[3] = index
        rng.bit_generator.state = state
        return rng

    def release_rng(self, rng: np.random.Generator) -> None:
        """Returns ``rng`` to the pool; it must not be used afterwards."""
        self._free.append(rng)

    def __repr__(self) -> str:
        return f"RngPool(seed={self._seed!r})"
