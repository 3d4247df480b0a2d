"""grain's per-stage statistics interface (``grain._src.python.dataset.stats``).

In grain every ``MapDataset`` and ``DatasetIterator`` has a ``_stats`` object,
and stages written for grain (in projects as in grain itself) use it::

    class WindowMapDataset(grain.MapDataset):
        def __getitem__(self, index):
            with self._stats.record_self_time():
                out = self._fn(self._parent[index])
                return self._stats.record_output_spec(out)

    class WindowIterator(grain.DatasetIterator):
        @stats.record_next_duration_if_output
        def __next__(self): ...

By default (``ExecutionTrackingMode.DISABLED``, debug mode off) ``_stats`` is the
recorder that records nothing, as grain's default one: the calls run and return
what grain's return. With debug mode or ``STAGE_TIMING`` it is an
``execution_stats.ExecutionStats``, which keeps grain's execution summaries.
Nothing is built unless a stage asks for ``_stats``. grain's telemetry,
``next_duration_ns``, is recorded with ``record_next_duration_if_output`` while
it is on (``grainlike.monitoring``). grainlike adds no profiler annotations.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import enum
import functools
import time
import weakref
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar

from grainlike.core import monitoring

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

# Categories grain gives its stages in profiler traces (``trace_input_pipeline``).
IPL_CAT_PREPROCESSING = "preprocessing"
IPL_CAT_READ = "read"
IPL_CAT_ENQUEUE = "enqueue"
IPL_CAT_UNKNOWN = "unknown"
IPL_CAT_PREFETCH = "prefetch"


class NodeType(enum.Enum):
    """The kind of stage a ``Stats`` belongs to."""

    DEFAULT = 1
    PREFETCH = 2
    INTERLEAVE = 3


class Timer:
    """A context manager that adds up the nanoseconds spent inside it, over every use.

    Not thread-safe: one timer per thread.

    Example:
      >>> timer = Timer()
      >>> with timer:
      ...     pass
      >>> timer.value() >= 0
      True
    """

    def __init__(self) -> None:
        self._accumulator = 0
        self._last = 0

    def __enter__(self) -> None:
        self._last = time.perf_counter_ns()

    def __exit__(self, *exc_info: Any) -> None:
        self._accumulator += time.perf_counter_ns() - self._last

    def value(self) -> int:
        """The nanoseconds spent inside the timer so far."""
        return self._accumulator

    def reset(self) -> None:
        """Starts counting again from 0."""
        self._accumulator = 0
        self._last = 0


class HashableWeakRef:
    """A weak reference hashed and compared by the identity of its object."""

    def __init__(self, obj: Any) -> None:
        self._obj_id = id(obj)
        self._weakref = weakref.ref(obj)

    def __call__(self) -> Any:
        return self._weakref()

    def __hash__(self) -> int:
        return self._obj_id

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, HashableWeakRef) and self._obj_id == other._obj_id


@dataclasses.dataclass(kw_only=True)
class StatsConfig:
    """What a ``Stats`` records about: its stage's name and kind, with grain's fields.

    Attributes:
      name: the stage's name (``str`` of the dataset or iterator).
      transform_mutates_spec: False when the stage passes its parent's elements
        through unchanged in structure (its output spec is its parent's).
      node_type: the kind of stage.
      log_summary: whether the output stage logs its execution summary periodically (debug mode).
      stats_in_queues: grain's queues of workers' summaries (unused here).
      stats_out_queue: grain's queue to the main process (unused here).
      iter_weakref: the dataset or iterator the stats belong to; not pickled.
    """

    name: str
    transform_mutates_spec: bool = True
    node_type: NodeType = NodeType.DEFAULT
    log_summary: bool = False
    stats_in_queues: Optional[tuple] = None
    stats_out_queue: Any = None
    iter_weakref: Optional[HashableWeakRef] = None

    @property
    def is_prefetch(self) -> bool:
        return self.node_type is NodeType.PREFETCH

    def __getstate__(self) -> dict:
        # A weak reference cannot be pickled, and means nothing in another process.
        state = dict(self.__dict__)
        state.pop("iter_weakref", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.iter_weakref = None


class Stats(abc.ABC):
    """Records statistics of one stage; a tree of them mirrors the pipeline's.

    Args:
      config: what the stage is.
      parents: the ``Stats`` of the stages it reads from; they are marked as not
        being the pipeline's output (``_is_output``).
    """

    def __init__(self, config: StatsConfig, parents: Sequence["Stats"]):
        self._config = config
        self._self_output_spec = None
        self._parents = parents
        self._is_output = True
        for parent in parents:
            parent._is_output = False

    @property
    def output_spec(self) -> Any:
        """The structure of the stage's elements as recorded, or its parent's if it keeps them."""
        if self._config.transform_mutates_spec or not self._parents:
            return self._self_output_spec
        return self._parents[0].output_spec

    @abc.abstractmethod
    def record_self_time(self, *, num_elements: int = 1, offset_ns: float = 0) -> contextlib.AbstractContextManager:
        """A context manager around the stage's own work on ``num_elements`` elements."""

    @abc.abstractmethod
    def record_output_spec(self, element: T) -> T:
        """Records the structure of ``element`` and returns ``element``."""

    @abc.abstractmethod
    def report(self) -> None:
        """Reports what was recorded."""

    @abc.abstractmethod
    def record_bytes_consumed(self, element: Any) -> Any:
        """Records the size of an element the stage read; returns ``element``."""

    @abc.abstractmethod
    def record_bytes_produced(self, element: Any) -> Any:
        """Records the size of an element the stage produced; returns ``element``."""

    def record_output_spec_for_batch(self, elements: Sequence[Optional[T]]) -> Sequence[Optional[T]]:
        """Records the spec of the first element that is not None; returns ``elements``."""
        first = next((element for element in elements or () if element is not None), None)
        if first is not None:
            self.record_output_spec(first)
        return elements


class NoStats(Stats):
    """The ``Stats`` of stages while execution statistics are off: each call runs and records nothing."""

    @contextlib.contextmanager
    def record_self_time(self, *, num_elements: int = 1, offset_ns: float = 0) -> Iterator[None]:
        yield

    def record_output_spec(self, element: T) -> T:
        return element

    def report(self) -> None:
        pass

    def record_bytes_consumed(self, element: Any) -> Any:
        return element

    def record_bytes_produced(self, element: Any) -> Any:
        return element


def is_stage_timing(mode: Any) -> bool:
    """Whether ``mode`` is ``ExecutionTrackingMode.STAGE_TIMING`` (the enum is defined above this module)."""
    return getattr(mode, "name", None) == "STAGE_TIMING"


def make_stats(config: StatsConfig, parents: Sequence[Stats], execution_tracking_mode: Any = None) -> Stats:
    """The ``Stats`` of a stage: execution statistics in debug mode or with ``STAGE_TIMING``, else none.

    In debug mode the output stage also logs its summary periodically (``config.log_summary``).
    """
    from grainlike.core.config import config as grain_config

    debug = bool(grain_config.py_debug_mode)
    if debug or is_stage_timing(execution_tracking_mode):
        from grainlike.dataset.execution_stats import ExecutionStats

        return ExecutionStats(dataclasses.replace(config, log_summary=debug), parents)
    return NoStats(config, parents)


def stats_of(node: Any) -> Stats:
    """A new ``Stats`` tree for a dataset or iterator and the stages it reads from (its ``_stats``)."""
    parents = [stats for stats in (getattr(p, "_stats", None) for p in getattr(node, "_parents", ())) if stats]
    config = StatsConfig(
        name=str(node),
        transform_mutates_spec=getattr(node, "_MUTATES_ELEMENT_SPEC", True),
        node_type=NodeType.PREFETCH if getattr(node, "_STATS_PREFETCH", False) else NodeType.DEFAULT,
        iter_weakref=HashableWeakRef(node),
    )
    options = getattr(getattr(node, "_ctx", None), "dataset_options", None)
    return make_stats(config, parents, getattr(options, "execution_tracking_mode", None))


# Keys in an iterator's __dict__, set only while telemetry is on: a stage another
# one reads from (not the output), and an iterator inside its own timed next().
_INNER = "_grainlike_inner_stage"
_BUSY = "_grainlike_timing_next"


def record_next_duration_if_output(next_fn: F) -> F:
    """Decorator of a ``DatasetIterator.__next__``: times the pipeline's output one (grain's ``next_duration_ns``).

    With telemetry on (``grainlike.monitoring``) when it decorates, the
    ``next()`` of the iterator no other iterator reads from is recorded, when it
    returns an element; otherwise ``next_fn`` is returned as it is, at no cost.
    grainlike's own stages are decorated this way when telemetry starts
    (``time_next_of``).
    """
    if not monitoring.recording or getattr(next_fn, "_grainlike_timed", False):
        return next_fn

    @functools.wraps(next_fn)
    def timed_next(self, *args: Any, **kwargs: Any) -> Any:
        own = self.__dict__
        if own.get(_INNER) or own.get(_BUSY):  # a stage under another, or super().__next__()
            return next_fn(self, *args, **kwargs)
        if _BUSY not in own:  # First next(): every stage under this one is not the output.
            below, seen = list(getattr(self, "_parents", ())), set()
            while below:
                node = below.pop()
                if id(node) not in seen:
                    seen.add(id(node))
                    below.extend(getattr(node, "_parents", ()))
                    try:
                        setattr(node, _INNER, True)
                    except AttributeError:  # (a stage of the user's with __slots__)
                        pass
        own[_BUSY] = True
        start = time.perf_counter_ns()
        try:
            result = next_fn(self, *args, **kwargs)
        finally:
            own[_BUSY] = False
        monitoring.exported().next_duration.Record(time.perf_counter_ns() - start)
        return result

    timed_next._grainlike_timed = True
    return timed_next  # type: ignore[return-value]


def time_next_of(cls: type) -> None:
    """Decorates ``cls.__next__`` (if ``cls`` defines one) with ``record_next_duration_if_output``."""
    next_fn = cls.__dict__.get("__next__")
    if next_fn is not None:
        cls.__next__ = record_next_duration_if_output(next_fn)


def trace_input_pipeline(stage_category: str = IPL_CAT_UNKNOWN, **trace_kwargs: Any) -> Callable[[F], F]:
    """Decorator of a stage's method: grain annotates it in profiler traces.

    grainlike adds no profiler annotations: the method is returned as it is.
    """
    del stage_category, trace_kwargs
    return _unchanged


def trace_input_pipeline_prefetch(func: F) -> F:
    """Decorator of prefetch's element reads (``func(stats, parent, index)``); returns ``func``."""
    return func


def trace_input_pipeline_next(stage_category: str = IPL_CAT_PREFETCH) -> Callable[[F], F]:
    """Decorator of a ``__next__`` (grain's profiler annotation); the method is returned as it is."""
    del stage_category
    return _unchanged


def _unchanged(func: F) -> F:
    return func
