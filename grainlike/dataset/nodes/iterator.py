"""``DatasetIterator``: the iterator stage, and the context its pipeline shares.

Its state is a small JSON-able dict of indices that each stage nests or forwards,
so a restore is exact and cheap.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import threading
from typing import Any, Iterator, Sequence, TypeVar, Union

from grainlike.core import monitoring
from grainlike.core.errors import ClosedIteratorError
from grainlike.core.protocols import OrbaxCheckpointable
from grainlike.dataset.nodes.dataset_node import walk

T = TypeVar("T")


class _Dropping(threading.local):
    """Per thread: how many iterators nobody holds are being closed (``close_dropped``)."""

    depth = 0


_DROPPING = _Dropping()


def close_dropped(iterator: Any) -> None:
    """Closes ``iterator``, which nobody holds any more (its ``__del__``); never raises.

    While it runs, ``closing_dropped()`` is true in this thread.
    """
    dropping = _DROPPING  # None once this module is torn down at exit.
    try:
        if dropping is not None:
            dropping.depth += 1
        try:
            iterator.close()
        finally:
            if dropping is not None:
                dropping.depth -= 1
    except Exception:  # A finalizer never raises.
        pass


def closing_dropped() -> bool:
    """Whether this thread is closing an iterator nobody holds: its workers are not waited for."""
    return _DROPPING.depth > 0


@dataclasses.dataclass(frozen=True)
class MultiprocessingContext:
    """Which worker process runs an iterator (``process_index`` of ``process_count``).

    Random transforms on iterators offset their per-element counters by it, so
    workers draw distinct numbers.
    """

    process_index: int = 0
    process_count: int = 1


@dataclasses.dataclass
class IteratorContext:
    """Context shared by all iterator stages of one pipeline, set before the first ``next()``."""

    mp_context: MultiprocessingContext = MultiprocessingContext()
    # grain's DatasetOptions, merged from every WithOptionsIterDataset.
    dataset_options: Any = None

    def __post_init__(self):
        if self.dataset_options is None:
            from grainlike.dataset.nodes.options import DatasetOptions

            self.dataset_options = DatasetOptions()

    def merge(self, other: "IteratorContext") -> None:
        self.dataset_options = self.dataset_options.merge(other.dataset_options)
        if self.mp_context != other.mp_context:
            raise ValueError(
                "Cannot merge contexts from different worker processes: "
                f"{self.mp_context} vs {other.mp_context}."
            )


class DatasetIterator(OrbaxCheckpointable, Iterator[T], abc.ABC):
    """The iterator stage: ``__next__``, ``get_state``, ``set_state``, ``close``.

    grainlike's ``core.protocols.DatasetIteratorProtocol``, with Orbax v1's
    ``save``/``load``. Not thread-safe: one thread uses an iterator at a time.
    """

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if cls.__module__.startswith("grainlike."):
            # grainlike's stages refuse too deep a state before reading it
            # (``dataset.state.guard_set_state``); users' own stages are left as written.
            from grainlike.dataset.nodes.state import guard_set_state

            guard_set_state(cls)
            if monitoring.recording:  # grain's next_duration_ns of the output iterator
                from grainlike.dataset.stats import time_next_of

                time_next_of(cls)

    def __init__(self, parents: Union["DatasetIterator", Sequence["DatasetIterator"]] = ()):
        super().__init__()
        # One iterator is one parent, whatever its class (tuple() of an iterator
        # of someone else's would read it to the end, forever if it is infinite).
        if isinstance(parents, DatasetIterator) or hasattr(type(parents), "__next__"):
            self._parents = (parents,)
        else:
            self._parents = tuple(parents)
        if self._parents:
            ctx = self._parents[0]._ctx
            # One context for the whole tree: merge the others' into the first
            # and point every iterator below at it.
            for parent in self._parents[1:]:
                ctx.merge(parent._ctx)
            for node in (n for parent in self._parents[1:] for n in walk(parent)):
                node._ctx = ctx
            self._ctx: IteratorContext = ctx
        else:
            self._ctx = IteratorContext()
        if len(self._parents) == 1:
            # An attribute, not a property: stages read it once per element.
            self._parent: DatasetIterator = self._parents[0]
        self._closed = False

    def __iter__(self) -> "DatasetIterator[T]":
        return self

    @abc.abstractmethod
    def get_state(self) -> dict:
        """Returns the iterator's position: a JSON-able dict of indices."""

    @abc.abstractmethod
    def set_state(self, state: dict) -> None:
        """Moves the iterator to ``state`` (from ``get_state``)."""

    def describe(self) -> str:
        """This stage as error notes name it: a user transform with its file and line (grainlike only).

        ``str()`` is grain's text, which names a transform class without its file.
        """
        return str(self)

    def start_prefetch(self) -> None:
        """Starts reading ahead in the first asynchronous stage (idempotent)."""
        for parent in self._parents:
            parent.start_prefetch()

    def close(self) -> None:
        """Releases threads and processes of this stage and its parents (idempotent).

        Advancing a closed iterator raises ``ClosedIteratorError`` (a ``ValueError``).
        """
        if getattr(self, "_closed", True):  # closed, or __init__ did not finish
            return
        self._closed = True
        self._close()

    def _close(self) -> None:
        """What ``close`` does, once: a stage releases its own threads, processes and files here."""
        for parent in self._parents:
            parent.close()

    @functools.cached_property
    def _stats(self) -> Any:
        """grain's statistics recorder of this stage, for stages written for grain (records nothing by default).

        See ``grainlike.dataset.stats``: ``with self._stats.record_self_time():``
        and ``self._stats.record_output_spec(x)`` run as in grain.
        """
        from grainlike.dataset.stats import stats_of

        return stats_of(self)

    def _assert_not_closed(self) -> None:
        if self._closed:
            raise ClosedIteratorError(f"Trying to advance a closed iterator: '{self}'.")

    def _get_next_index(self) -> int:
        """The index of the element the next ``next()`` returns."""
        raise NotImplementedError(f"{self} cannot report its next index")

    def _set_next_index(self, index: int) -> None:
        """Moves to the element at ``index`` without computing any element."""
        raise NotImplementedError(f"{self} cannot move to an index without reading")

    def __del__(self):
        closer = close_dropped  # None while the interpreter tears the module down at exit
        if closer is not None:
            closer(self)


def get_next_index(ds_iter: DatasetIterator) -> int:
    """The index of the element ``ds_iter`` returns next (grain's experimental API)."""
    return ds_iter._get_next_index()


def set_next_index(ds_iter: DatasetIterator, index: int) -> None:
    """Moves ``ds_iter`` to the element at ``index`` without reading any element."""
    ds_iter._set_next_index(index)


def _time_grainlike_iterators() -> None:
    """Once telemetry starts: times the ``next()`` of grainlike's iterator classes made before it."""
    from grainlike.dataset.stats import time_next_of

    for cls in walk(DatasetIterator, type.__subclasses__):
        if cls is not DatasetIterator and cls.__module__.startswith("grainlike."):
            time_next_of(cls)


monitoring.on_recording(_time_grainlike_iterators)
