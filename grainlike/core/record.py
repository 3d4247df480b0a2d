"""Record metadata as the sampler emits it, and a record travelling the pipeline."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Generic, Optional, TypeVar

import numpy as np

T = TypeVar("T")


class _NoEntropy(np.random.SeedSequence):
    """A seed sequence that draws no OS entropy; the caller sets the key after.

    ``Philox(key=k)`` still builds a ``SeedSequence(None)``, which reads
    ``os.urandom``, only to overwrite what it seeds with ``k``. Spawning from it
    stays possible (and is deterministic).
    """

    def generate_state(self, n_words, dtype=np.uint32):
        return np.zeros(n_words, dtype)


_NO_ENTROPY = _NoEntropy(0)
_ZEROS4 = np.zeros(4, np.uint64)
_MASK64 = (1 << 64) - 1


def philox_state(key: np.ndarray, counter: np.ndarray = _ZEROS4) -> dict:
    """The state of a Philox generator with ``key`` (two uint64 words) at ``counter``.

    Its buffer is empty, so the next draw starts at ``counter`` exactly as a
    generator built with that key and counter would.
    """
    return {
        "bit_generator": "Philox",
        "state": {"counter": counter, "key": key},
        "buffer": _ZEROS4,
        "buffer_pos": 4,
        "has_uint32": 0,
        "uinteger": 0,
    }


def philox_generator(key: int, spare: Optional[list] = None) -> np.random.Generator:
    """``np.random.Generator(np.random.Philox(key=key))``, built about twice as fast.

    The state set here (key, zero counter, empty buffer) is exactly what
    ``Philox(key=key)`` makes, so the draws are identical. With ``spare`` (a
    list of generators nothing else refers to, see ``LazyRng.recycle``), one of
    them is set to that state instead of building a new one.
    """
    if not 0 <= key < 1 << 128:
        return np.random.Generator(np.random.Philox(key=key))  # Its own error.
    state = philox_state(np.array([key & _MASK64, key >> 64], np.uint64))
    if spare:
        generator = spare.pop()
        generator.bit_generator.state = state
        return generator
    bit_generator = np.random.Philox(seed=_NO_ENTROPY)
    bit_generator.state = state
    return np.random.Generator(bit_generator)


def _references(holder: "LazyRng") -> tuple[int, int]:
    """``sys.getrefcount`` of the holder's generator and of its bit generator, seen from here."""
    generator = holder._generator
    bit_generator = generator.bit_generator
    return sys.getrefcount(generator), sys.getrefcount(bit_generator)


class LazyRng:
    """Placeholder for a record's rng, built on first use.

    Building a ``np.random.Generator(np.random.Philox(key=k))`` costs more than the
    whole per-record budget of a fast loader, so the metadata stores only the key and
    builds the generator when a random transform asks for it. The draws are identical
    to an eagerly built generator with the same key. The generator is built once:
    metadata copies that share this placeholder (``remove_record_key``) share one
    generator, as copies of grain's metadata share theirs.
    """

    __slots__ = ("key", "_generator")

    def __init__(self, key: int):
        self.key = key
        self._generator: Optional[np.random.Generator] = None

    def build(self, spare: Optional[list] = None) -> np.random.Generator:
        """The generator, built on the first call (from ``spare`` if it has one)."""
        generator = self._generator
        if generator is None:
            generator = self._generator = philox_generator(self.key, spare)
        return generator

    def recycle(self, spare: list) -> None:
        """Moves the built generator to ``spare`` if nothing but this holder refers to it.

        For a holder about to be dropped, whose record's transforms are done: a
        transform that kept the generator (or its bit generator) keeps it to
        itself, and only generators no one can draw from again are reused.
        """
        if self._generator is None or _references(self) != _UNSHARED:
            return
        spare.append(self._generator)
        self._generator = None

    def __getstate__(self):
        # A generator built and already drawn from travels as it is.
        return (self.key, self._generator)

    def __setstate__(self, state):
        self.key, self._generator = state


# What ``_references`` sees for a generator held by its holder alone: measured
# once, so that it holds whatever this interpreter counts.
_probe = LazyRng(0)
_probe.build()
_UNSHARED = _references(_probe)
del _probe


class RecordMetadata:
    """Where a record comes from: grain's ``RecordMetadata``.

    Samplers emit it to say which record to read next; it then travels with the
    record through the operations. It is a dataclass to ``dataclasses`` (fields
    ``index``, ``record_key``, ``rng``; ``replace``, ``asdict``) and compares,
    prints and copies as grain's does.

    Attributes:
      index: the global position of the record in the sampler's stream.
      record_key: the key to read from the data source (``source[record_key]``).
      rng: the record's own random generator (``None`` when the sampler has no seed).
        Random transforms draw from it, so their output depends only on the seed and
        the index, not on worker count or timing. grainlike's samplers store a
        ``LazyRng`` and the generator is built when ``rng`` is first read.

    Example:
      >>> m = RecordMetadata(index=3, record_key=7)
      >>> m.remove_record_key()
      RecordMetadata(index=3, record_key=None, rng=None)
    """

    # Written by hand rather than by @dataclass: ``rng`` must be a property over a
    # slot holding the placeholder, and samplers build one of these per record.
    __slots__ = ("index", "record_key", "_rng")

    def __init__(self, index: int, record_key: Optional[int] = None, rng: Any = None):
        self.index = index
        self.record_key = record_key
        self._rng = rng

    @property
    def rng(self) -> Optional[np.random.Generator]:
        rng = self._rng
        if type(rng) is LazyRng:
            rng = self._rng = rng.build()
        return rng

    @rng.setter
    def rng(self, value: Any) -> None:
        self._rng = value

    def remove_record_key(self) -> "RecordMetadata":
        """The metadata without its record key (itself if it has none), sharing the rng."""
        if self.record_key is None:
            return self
        return RecordMetadata(self.index, None, self._rng)

    def __repr__(self) -> str:
        return (
            f"RecordMetadata(index={self.index!r}, record_key={self.record_key!r}, "
            f"rng={self.rng!r})"
        )

    def __str__(self) -> str:
        return (
            f"RecordMetadata(index={self.index}, record_key={self.record_key}, "
            f"rng={self.rng})"
        )

    def __eq__(self, other: object) -> bool:
        # The dataclass comparison, on the stored rng: a placeholder stands for the
        # one generator it builds, so it is equal only to itself, as a generator is.
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.index, self.record_key, self._rng) == (
            other.index,
            other.record_key,
            other._rng,
        )

    # Mutable and compared by value, hence unhashable, as a dataclass.
    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self):
        return (self.index, self.record_key, self._rng)

    def __setstate__(self, state):
        self.index, self.record_key, self._rng = state


@dataclasses.dataclass
class _RecordMetadataFields:
    index: int
    record_key: Optional[int] = None
    rng: Optional[np.random.Generator] = None


# ``dataclasses`` finds grain's three fields: fields(), replace(), asdict() work.
RecordMetadata.__dataclass_fields__ = _RecordMetadataFields.__dataclass_fields__  # type: ignore[attr-defined]
RecordMetadata.__dataclass_params__ = _RecordMetadataFields.__dataclass_params__  # type: ignore[attr-defined]
RecordMetadata.__match_args__ = ("index", "record_key", "rng")  # type: ignore[attr-defined]


@dataclasses.dataclass(slots=True)
class Record(Generic[T]):
    """A record's metadata and its data as it moves through the operations."""

    metadata: RecordMetadata
    data: T
