"""What grainlike asks of iterators and stages, declared as ``typing.Protocol``s.

Code asks ``isinstance(x, Checkpointable)`` instead of probing for methods; an
object of your own satisfies a protocol by having its methods, without inheriting
from it. A runtime ``isinstance`` against a protocol costs microseconds, so it is
asked once, when a stage or iterator is built, never per record.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol, TypeVar, runtime_checkable

_C = TypeVar("_C", bound="ClosesOnExit")


@runtime_checkable
class Checkpointable(Protocol):
    """Saves and restores its position: after ``set_state(s)`` it continues where ``s`` was read."""

    def get_state(self) -> Any: ...
    def set_state(self, state: Any) -> None: ...


@runtime_checkable
class Closeable(Protocol):
    """Owns threads, processes or files, which ``close()`` releases (idempotent)."""

    def close(self) -> None: ...


@runtime_checkable
class Prefetching(Protocol):
    """Starts reading ahead before the first ``next()`` when asked (e.g. while a model restores)."""

    def start_prefetch(self) -> None: ...


@runtime_checkable
class TakesAllocator(Protocol):
    """A batching stage that stacks its batches with the allocator a worker gives it (shared memory)."""

    def set_allocator(self, alloc: Any) -> None: ...


@runtime_checkable
class TakesChunks(Protocol):
    """An iterator that hands over many elements at once: ``to_iter_dataset()``'s, and maps and filters over one.

    ``take(k)`` returns what up to ``k`` calls of ``next()`` would (at least
    one), as a ``grainlike.dataset.transformations.chunk.Chunk``, and raises as
    ``next()`` does (``StopIteration`` at the end).
    """

    def take(self, k: int) -> Any: ...


@runtime_checkable
class SupportsInPlaceSlicing(Protocol):
    """A stage that can cut itself down to one worker's share (grain's protocol).

    Implement it on a dataset of your own that ``mp_prefetch`` should slice:
    ``set_slice(slice(w, None, W), sequential_slice)`` is called on worker
    ``w``'s copy of the stage, never on the dataset you built.
    """

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None: ...


@runtime_checkable
class ProcessStatesMerger(Protocol):
    """An iterator that restores from the state files of another number of processes.

    A DataLoader iterator is one: its state names the worker positions of one
    shard, and the loader recomputes every old shard's records to merge them.
    """

    def _merge_process_states(self, texts: dict, old_count: int) -> str:
        """This process's state text continuing ``texts`` (old process index -> state text)."""


@runtime_checkable
class DatasetIteratorProtocol(Checkpointable, Closeable, Protocol):
    """An iterator stage, and all that a stage may ask of its parent iterators.

    ``get_state()`` is a JSON-able dict of indices; ``set_state`` validates before
    changing anything; ``close()`` closes the parents too, and a closed stage's
    ``__next__`` raises ``ClosedIteratorError``. A ``Prefetching`` parent reads ahead when asked.
    """

    def __iter__(self) -> Iterator[Any]: ...
    def __next__(self) -> Any: ...


class ClosesOnExit:
    """A ``Closeable`` (a subclass defines ``close``) that ``with`` closes when the block ends."""

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class OrbaxCheckpointable:
    """Orbax v1's ``StatefulCheckpointable`` for a ``Checkpointable``: the state is read now, written later."""

    async def save(self, directory: Any) -> Any:
        from grainlike.core import state_files  # Only when Orbax calls it.
        return await state_files.save_state_async(self, directory)

    async def load(self, directory: Any) -> Any:
        from grainlike.core import state_files
        return await state_files.load_state_async(self, directory)


def missing_state_methods(obj: Any, methods: tuple = ("get_state", "set_state")) -> str:
    """``""`` when ``obj`` has ``methods``, else what errors name as missing, e.g. ``"get_state()/set_state()"``."""
    if methods == ("get_state", "set_state") and isinstance(obj, Checkpointable):
        return ""
    return "/".join(f"{m}()" for m in methods if not callable(getattr(obj, m, None)))


def close_if_closeable(obj: Any) -> None:
    """``obj.close()`` where ``obj`` is ``Closeable``; nothing otherwise."""
    if isinstance(obj, Closeable):
        obj.close()
