"""The random-access source protocol, the ``waits`` declaration, the sources' base classes and ``RangeDataSource``.

A source is anything with ``len(source)`` and ``source[record_key]``; it is read
from several threads and processes at once, so reads must be thread-safe and
deterministic, and the source must pickle cheaply (it is sent to every worker).
"""

from __future__ import annotations

import hashlib
import math
import operator
import typing
from typing import Any, Iterator, Protocol, Sequence, SupportsIndex, TypeVar

import numpy as np

from grainlike.core.protocols import ClosesOnExit
from grainlike.sources.formats.remote_options import is_remote

T = TypeVar("T", covariant=True)


@typing.runtime_checkable
class RandomAccessDataSource(Protocol[T]):
    """Structural type of a data source: ``__len__`` and ``__getitem__``.

    Sources need not inherit from this class; any object with these two methods
    passes ``isinstance(obj, RandomAccessDataSource)``.

    Contract:
      * ``__getitem__(record_key)`` takes an int in ``[0, len(self))`` and is
        thread-safe and deterministic (the same key always gives the same record).
      * ``__repr__`` identifies the data: the loader stores it in checkpoints and
        compares it on restore, so it must not contain addresses or random names.
      * The source must pickle for multiprocess loading. File-backed sources open
        their readers lazily in the process that reads, and drop them when pickled
        (a reader inherited across ``fork`` is not safe to use).

    Optional batched reads:
      A source may also define ``__getitems__(self, record_keys: Sequence[int]) ->
      list``, returning the records for ``record_keys`` in the same order (keys may
      repeat and need not be sorted). When it is present the loader reads many keys
      in one call instead of calling ``__getitem__`` once per key; for ArrayRecord
      files that is about ten times faster. It must return exactly
      ``[self[k] for k in record_keys]``.

    Example:
        class Squares:
            def __len__(self):
                return 10

            def __getitem__(self, record_key):
                return record_key * record_key

            def __repr__(self):
                return "Squares(10)"

        assert isinstance(Squares(), RandomAccessDataSource)
    """

    def __len__(self) -> int:
        """Returns the number of records."""
        ...

    def __getitem__(self, record_key: int) -> T:
        """Returns the record for ``record_key`` in ``[0, len(self))``."""
        ...


@typing.runtime_checkable
class SupportsBatchedRead(RandomAccessDataSource[T], Protocol[T]):
    """A source that also reads many keys in one call (see ``RandomAccessDataSource``).

    Example:
        if isinstance(source, SupportsBatchedRead):
            records = source.__getitems__([3, 1, 4])
    """

    def __getitems__(self, record_keys: Sequence[int]) -> list: ...


@typing.runtime_checkable
class DeclaresWaiting(Protocol):
    """A source or transform that declares whether its work per record waits.

    ``waits = True``: reading or mapping a record mostly waits on something other
    than this process's CPU (remote storage, a service, a sleep); such work runs in
    grain's 16 read threads by default. ``waits = False``: the work is local and
    CPU-bound; it runs in the calling thread by default. An explicit ``ReadOptions``
    overrides both. A class attribute, a property or an attribute set on a function
    declares it; the value must be a bool (``grainlike.sources.waiting``).

    Example:
        class Fetch(grainlike.MapTransform):
            waits = True  # an HTTP request per record

            def map(self, url):
                return requests.get(url).content

        def parse(line):
            return line.split(",")

        parse.waits = False  # pure Python: no threads
    """

    waits: bool


@typing.runtime_checkable
class PinsRemoteObjects(Protocol):
    """A source that reads remote objects, each at the version it pinned when built.

    The DataLoader writes ``object_pins()`` into its state (a key grain ignores)
    when it is not empty, and on restore reads through ``at_versions(saved)`` when
    an object's version has changed since: the saved versions where the store
    keeps them (S3 versioning, GCS generations), else ``ObjectChangedError``
    naming the object and both versions. ``ParquetDataSource`` and
    ``ArrayRecordDataSource`` implement it.
    """

    def object_pins(self) -> dict:
        """``{url: pin}`` of the remote objects read (empty when all are local); a pin as ``remote_pins.pin_state``."""
        ...

    def at_versions(self, pins: dict) -> "PinsRemoteObjects":
        """A copy of this source reading the objects at the versions ``pins`` names.

        Raises:
          ObjectChangedError: the store no longer has a named version.
          InvalidStateError: ``pins`` names another object or is malformed.
        """
        ...


class ClosingSource(ClosesOnExit):
    """Base of the sources that hold readers, files or memory until ``close()``.

    ``with source:`` closes it on exit; iterating reads every record in key order.
    The attributes named in ``_per_process`` (readers, locks, caches) are never
    pickled: ``_init_per_process`` builds them again in the process that unpickles.
    """

    _per_process: tuple = ()
    _key_error: type = IndexError  # The type of the error for a record key out of range.

    def close(self) -> None:
        """Releases the source's readers, files or memory (each subclass says which)."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        for key in range(len(self)):  # type: ignore[arg-type]
            yield self[key]  # type: ignore[index]

    def _init_per_process(self) -> None:
        """Builds the attributes named in ``_per_process``."""

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in self._per_process}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_per_process()

    def _copy(self) -> Any:
        """A copy of this source with no readers open (as a worker unpickles it)."""
        copy = type(self).__new__(type(self))
        copy.__setstate__(self.__getstate__())
        return copy

    def _check_key(self, record_key: SupportsIndex) -> int:
        """``record_key`` as an int in ``[0, len(self))``, else ``_out_of_range``'s error."""
        key = operator.index(record_key)
        if key < 0 or key >= len(self):  # type: ignore[arg-type]
            raise self._out_of_range(key)
        return key

    def _out_of_range(self, key: int) -> Exception:
        return self._key_error(f"record_key {key} is out of range for {type(self).__name__} of length {len(self)}")


class FileSource(ClosingSource):
    """Base of the sources that read files, local or remote (``_paths``: one string per file)."""

    _paths: list

    @property
    def waits(self) -> bool:
        """Whether reads wait (a file is remote): local files are read in the calling thread by default."""
        return any(is_remote(p) for p in self._paths)

    @property
    def paths(self) -> list[str]:
        """The files, one per path or file instruction, as strings (as Grain's ``paths``)."""
        return list(self._paths)

    def _hash_of_paths(self) -> str:
        # Grain's: a hash, since the list of paths can be very long (sha1 updated path by path).
        return hashlib.sha1("".join(self._paths).encode()).hexdigest()


class RangeDataSource:
    """Records ``start, start + step, ...`` below ``stop``, like ``range()``.

    Lengths, errors and repr follow Grain's ``RangeDataSource``: the length is
    ``ceil((stop - start) / step)`` (so ``RangeDataSource(10, 0, 1)`` is an error,
    not an empty range), negative keys are out of range.

    Args:
      start: first record.
      stop: end of the range (exclusive).
      step: distance between records; not zero.

    Example:
        source = RangeDataSource(0, 10, 2)
        assert len(source) == 5 and source[1] == 2
        repr(source)  # 'RangeDataSource(start=0, stop=10, step=2)'
    """

    waits = False  # Computed, never read: read in the calling thread.

    def __init__(self, start: int, stop: int, step: int):
        # Grain raises AssertionError here; raised explicitly so `python -O` agrees.
        if step == 0:
            raise AssertionError("step can't be zero.")
        self._start = start
        self._stop = stop
        self._step = step
        # Float division on purpose: it is Grain's formula, and the length feeds the
        # sampler, so it must agree with Grain's even where floats round.
        self._len = int(math.ceil((stop - start) / step))
        if self._len < 0:
            raise AssertionError("length can't be negative.")

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, record_key: SupportsIndex) -> int:
        record_key = operator.index(record_key)
        if record_key < 0 or record_key >= self._len:
            raise IndexError(f"Index {record_key} out of range for {self._len}")
        return self._start + record_key * self._step

    def __getitems__(self, record_keys: Sequence[SupportsIndex]) -> list:
        keys = np.asarray(record_keys)
        fits_int64 = max(abs(self._start), abs(self._stop)) + abs(self._step) < 1 << 62
        if keys.ndim == 1 and keys.size and keys.dtype.kind in "iu" and fits_int64:
            # One vectorised expression for the whole chunk: the same ints.
            if keys.min() >= 0 and keys.max() < self._len:
                return (keys.astype(np.int64) * self._step + self._start).tolist()
        return [self[k] for k in record_keys]

    def __repr__(self) -> str:
        return f"RangeDataSource(start={self._start}, stop={self._stop}, step={self._step})"
