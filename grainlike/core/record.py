"""Record metadata as the sampler emits it, and a record travelling the pipeline."""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, Optional, TypeVar

import numpy as np

T = TypeVar("T")


class LazyRng:
    """Placeholder for a record's rng, built on first use.

    Building a ``np.random.Generator(np.random.Philox(key=k))`` costs more than the
    whole per-record budget of a fast loader, so the metadata stores only the key and
    builds the generator when a random transform asks for it. The draws are identical
    to an eagerly built generator with the same key.
    """

    __slots__ = ("key",)

    def __init__(self, key: int):
        self.key = key

    def build(self) -> np.random.Generator:
        # An explicit counter=0 is the default stream, and builds ~30% faster
        # than key alone (numpy skips its seeding path).
        return np.random.Generator(np.random.Philox(counter=0, key=self.key))


class RecordMetadata:
    """Where a record comes from.

    Attributes:
      index: the global position of the record in the sampler's stream.
      record_key: the key to read from the data source (``source[record_key]``).
      rng: the record's own random generator (``None`` when the sampler has no seed).
        Random transforms draw from it, so their output depends only on the seed and
        the index, not on worker count or timing.
    """

    __slots__ = ("index", "record_key", "_rng")

    def __init__(self, index: int, record_key: Optional[int] = None, rng: Any = None):
        self.index = index
        self.record_key = record_key
        self._rng = rng

    @property
    def rng(self) -> Optional[np.random.Generator]:
        rng = self._rng
        if type(rng) is LazyRng:
            rng = rng.build()
            self._rng = rng
        return rng

    @rng.setter
    def rng(self, value: Any) -> None:
        self._rng = value

    def remove_record_key(self) -> "RecordMetadata":
        return RecordMetadata(index=self.index, record_key=None, rng=self._rng)

    def __repr__(self) -> str:
        return (
            f"RecordMetadata(index={self.index}, record_key={self.record_key}, "
            f"rng={self.rng})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RecordMetadata):
            return NotImplemented
        return self.index == other.index and self.record_key == other.record_key

    def __hash__(self) -> int:
        return hash((self.index, self.record_key))

    def __getstate__(self):
        return (self.index, self.record_key, self._rng)

    def __setstate__(self, state):
        self.index, self.record_key, self._rng = state


@dataclasses.dataclass(slots=True)
class Record(Generic[T]):
    """A record's metadata and its data as it moves through the operations."""

    metadata: RecordMetadata
    data: T
