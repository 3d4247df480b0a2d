"""grain's execution statistics: per stage, its processing time, the elements it produced and their structure.

They are collected when grain's debug mode is on
(``grainlike.config.update("py_debug_mode", True)``) or the pipeline's options
say ``ExecutionTrackingMode.STAGE_TIMING``, and read with
``get_execution_summary(iterator)``: an ``ExecutionSummary`` protobuf
(``grainlike.proto.execution_summary_pb2``), its nodes numbered from the
iterator (0) through its parents, depth first, as grain numbers them. Debug
mode also logs the summary table every minute (``summary_table``).

When an iterator is made (``IterDataset.__iter__``) with statistics on, each
grainlike stage of its tree gets an ``ExecutionStats`` (its ``_stats``) and is
switched to a subclass of its class whose element methods (``__next__``,
``take``, ``_getitems``, ``_iter_items``, ``__getitem__``) are timed. With
statistics off nothing is switched: stages run their own methods, at no cost
per element. A stage's processing time is its own: the time of its call less
that of the timed calls it makes (to its parents) in the same thread. A chunk
(``take(k)``, ``_getitems(indices)``) counts as its elements, each taking the
chunk's time divided by their number. Stages of the user's, written for grain,
record through ``self._stats`` themselves, as in grain.
"""

from __future__ import annotations

import contextlib
import copyreg
import functools
import logging
import math
import sys
import threading
import time
import weakref
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from grainlike.core.tree import flatten, spec_like
from grainlike.dataset.stats import HashableWeakRef, NodeType, Stats, StatsConfig

_LOG = logging.getLogger(__name__)
# How often debug mode logs the summary, and how long after the last element it stops (grain's).
_LOG_EXECUTION_SUMMARY_PERIOD_SEC = 60
_REPORTING_TIMEOUT_SEC = 120

NOT_COLLECTED = (
    "Set `grain_py_debug_mode` or set `execution_tracking_mode` in grain"
    " options to `STAGE_TIMING` to enable execution statistics collection."
)


def byte_size(element: Any) -> int:
    """The bytes of ``element``'s arrays (also in shared memory), strings and byte strings (grain counts no other leaf)."""
    if isinstance(element, (int, float, np.generic)):
        return 0
    total = 0
    for leaf in flatten(element):
        if isinstance(leaf, np.ndarray):
            total += leaf.nbytes
        elif isinstance(leaf, (str, bytes)):
            total += len(leaf)
        elif type(leaf).__name__ == "SharedMemoryArrayMetadata":
            total += math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
    return total


def _keys_sorted(spec: Any) -> Any:
    """``spec`` with its dicts' keys in order, as grain's tree functions (jax's) give them."""
    if type(spec) is dict:
        try:
            keys = sorted(spec)
        except TypeError:  # keys of several types: as they are
            keys = list(spec)
        return {key: _keys_sorted(spec[key]) for key in keys}
    if type(spec) in (list, tuple):
        return type(spec)(_keys_sorted(x) for x in spec)
    return spec


class ExecutionStats(Stats):
    """The statistics of one stage, folded in as they are recorded (thread-safe)."""

    def __init__(self, config: StatsConfig, parents: Sequence[Stats]):
        super().__init__(config, parents)
        self._lock = threading.Lock()
        self._num_produced = 0
        self._total_ns = 0
        self._min_ns = sys.maxsize  # grain's value while nothing was produced
        self._max_ns = 0
        self._bytes_consumed = 0
        self._bytes_produced = 0
        self._last_update = 0.0
        self._logging = False
        # The prefetch stage's stats that consume this stage's outputs (their bytes).
        self._feeds: "ExecutionStats | None" = None
        # Whether the stage is a prefetch that buffers elements (grain records their bytes).
        self._records_bytes = False
        # mp_prefetch: a weak method giving its workers' latest summaries (``worker_stats``).
        self._workers: "weakref.WeakMethod | None" = None

    def __reduce__(self):
        return ExecutionStats, (self._config, self._parents)

    def add(self, duration_ns: int, num_elements: int) -> None:
        """Records ``num_elements`` produced in ``duration_ns``."""
        if num_elements <= 0:
            return
        each = duration_ns // num_elements
        with self._lock:
            self._num_produced += num_elements
            self._total_ns += duration_ns
            self._min_ns = min(self._min_ns, each)
            self._max_ns = max(self._max_ns, each)
        if self._is_output and self._config.log_summary:
            self._last_update = time.time()
            if not self._logging:
                self._start_logging()

    @contextlib.contextmanager
    def record_self_time(self, *, num_elements: int = 1, offset_ns: float = 0) -> Iterator[None]:
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            self.add(int(time.perf_counter_ns() - start + offset_ns), num_elements)

    def record_output_spec(self, element: Any) -> Any:
        if self._self_output_spec is None:
            self._self_output_spec = spec_like(element)
        return element

    def record_bytes_consumed(self, element: Any) -> Any:
        self.add_bytes(consumed=byte_size(element))
        return element

    def record_bytes_produced(self, element: Any) -> Any:
        self.add_bytes(produced=byte_size(element))
        return element

    def add_bytes(self, *, consumed: int = 0, produced: int = 0) -> None:
        """Records bytes the stage read and handed over."""
        with self._lock:
            self._bytes_consumed += consumed
            self._bytes_produced += produced

    def report(self) -> None:
        """Nothing to fold in: the statistics are up to date as they are recorded."""

    def _build_execution_summary(self, summary: Any, node_id: int) -> tuple[Any, int]:
        """Adds this stage as node ``node_id`` and its parents after it, depth first; returns the last id used."""
        node = summary.nodes[node_id]
        node.id = node_id
        node.name = self._config.name
        node.output_spec = str(_keys_sorted(self.output_spec))
        node.is_output = self._is_output
        node.is_prefetch = self._config.is_prefetch
        with self._lock:
            node.num_produced_elements = self._num_produced
            node.total_processing_time_ns = self._total_ns
            node.min_processing_time_ns = self._min_ns
            node.max_processing_time_ns = self._max_ns
            node.bytes_consumed = self._bytes_consumed
            node.bytes_produced = self._bytes_produced
        this = node_id
        for parent in self._parents:
            node_id += 1
            summary.nodes[this].inputs.append(node_id)
            if isinstance(parent, ExecutionStats):
                _, node_id = parent._build_execution_summary(summary, node_id)
            else:  # a recorder made before statistics were on
                summary.nodes[node_id].id = node_id
        workers = self._workers() if self._workers is not None else None
        if workers is not None:
            node_id = _add_worker_nodes(summary, this, node_id, workers())
        return summary, node_id

    def _get_execution_summary(self) -> Any:
        """The ``ExecutionSummary`` of this stage (node 0) and the stages it reads from."""
        from grainlike.proto import execution_summary_pb2

        summary, _ = self._build_execution_summary(execution_summary_pb2.ExecutionSummary(), 0)
        populate_wait_time_ratio(summary)
        return summary

    def _start_logging(self) -> None:
        with self._lock:
            if self._logging:
                return
            self._logging = True
        threading.Thread(target=_log_periodically, args=(weakref.ref(self),), daemon=True,
                         name="grainlike-execution-summary").start()


def _merge(summaries: Sequence[Any]) -> Any:
    """The workers' summaries added up node by node (their pipelines are the same, so are their node ids)."""
    from grainlike.proto import execution_summary_pb2

    merged = execution_summary_pb2.ExecutionSummary()
    for summary in summaries:
        for node_id, node in summary.nodes.items():
            if node_id not in merged.nodes:
                merged.nodes[node_id].CopyFrom(node)
                continue
            into = merged.nodes[node_id]
            into.min_processing_time_ns = min(into.min_processing_time_ns, node.min_processing_time_ns)
            into.max_processing_time_ns = max(into.max_processing_time_ns, node.max_processing_time_ns)
            into.total_processing_time_ns += node.total_processing_time_ns
            into.num_produced_elements += node.num_produced_elements
            into.bytes_produced += node.bytes_produced
            into.bytes_consumed += node.bytes_consumed
    return merged


def _add_worker_nodes(summary: Any, this: int, last_id: int, summaries: Sequence[Any]) -> int:
    """Puts the workers' stages, added up, under node ``this`` (mp_prefetch), numbered after ``last_id``, as grain.

    The workers' output stages become ``this``'s inputs (and are no longer
    outputs). Returns the last id used.
    """
    if not summaries:
        return last_id
    merged = _merge(summaries)
    offset = last_id + 1
    for node_id in sorted(merged.nodes):
        node = summary.nodes[node_id + offset]
        node.CopyFrom(merged.nodes[node_id])
        node.id = node_id + offset
        inputs = [i + offset for i in node.inputs]
        node.ClearField("inputs")
        node.inputs.extend(inputs)
        if node.is_output:
            node.is_output = False
            summary.nodes[this].inputs.append(node.id)
    return offset + max(merged.nodes)


def _log_periodically(stats_ref: Callable[[], "ExecutionStats | None"]) -> None:
    """Debug mode: logs the output stage's summary every period while elements keep coming (grain's log)."""
    from grainlike.dataset.summary_table import summary_log_message

    logged_at = 0.0
    while True:
        time.sleep(_LOG_EXECUTION_SUMMARY_PERIOD_SEC)
        stats = stats_ref()
        if stats is None or not stats._is_output or time.time() - stats._last_update >= _REPORTING_TIMEOUT_SEC:
            if stats is not None:
                stats._logging = False
            return
        if stats._last_update > logged_at:
            logged_at = time.time()
            _LOG.info(summary_log_message(stats._get_execution_summary()))
        del stats  # not held while sleeping: the iterator's stats may go with it


def _nodes_up_to_prefetch(summary: Any, node_id: int) -> list:
    """``node_id`` and the nodes it reads from, down to and including the first prefetch node on each path."""
    found, todo = [], [node_id]
    while todo:
        current = todo.pop()
        found.append(current)
        if not summary.nodes[current].is_prefetch:
            todo.extend(summary.nodes[current].inputs)
    return found


def _processing_ns(summary: Any, node_ids: list) -> int:
    return sum(summary.nodes[i].total_processing_time_ns for i in node_ids)


def _share_wait_time(summary: Any, node_id: int, waited_ns: int, factor: float) -> None:
    if waited_ns == 0:
        return
    node = summary.nodes[node_id]
    node.wait_time_ratio = round(factor * node.total_processing_time_ns / waited_ns, 4)
    for input_id in node.inputs:
        if node.is_prefetch:
            # What the consumer waits on a prefetch node is the work of the nodes
            # running under it, in proportion to their processing times; the
            # prefetch node itself shows none, so the ratios add up to 1.
            factor = node.wait_time_ratio
            waited_ns = _processing_ns(summary, _nodes_up_to_prefetch(summary, input_id))
            node.wait_time_ratio = 0
        _share_wait_time(summary, input_id, waited_ns, factor)


def populate_wait_time_ratio(summary: Any) -> None:
    """Sets each node's ``wait_time_ratio``: its share of the time the consumer of node 0 waits (grain's)."""
    _share_wait_time(summary, 0, _processing_ns(summary, _nodes_up_to_prefetch(summary, 0)), 1)


# ---------------------------------------------------------------------------
# Timing grainlike's stages.


class _Frames(threading.local):
    """Per thread: the stages whose timed calls are running, and the time their timed callees took."""

    def __init__(self) -> None:
        self.stats: list = [None]
        self.inner_ns: list = [0]


_FRAMES = _Frames()


def _first(elements: Any) -> Any:
    return next((e for e in elements if e is not None), None)


def _timed_call(stats: ExecutionStats, call: Callable[[], Any], count: Callable[[Any], int],
                outputs: Callable[[Any], Any]) -> Any:
    frames = _FRAMES
    if frames.stats[-1] is stats:  # the stage calling its own timed method: counted once, outside
        return call()
    frames.stats.append(stats)
    frames.inner_ns.append(0)
    start = time.perf_counter_ns()
    try:
        result = call()
    finally:
        elapsed = time.perf_counter_ns() - start
        frames.stats.pop()
        inner = frames.inner_ns.pop()
        frames.inner_ns[-1] += elapsed
    stats.add(elapsed - inner, count(result))
    if stats._self_output_spec is None or stats._records_bytes or stats._feeds is not None:
        elements = outputs(result)
        first = _first(elements)
        if first is not None:
            stats.record_output_spec(first)
        if stats._records_bytes or stats._feeds is not None:
            size = sum(byte_size(element) for element in elements)
            if stats._records_bytes:
                stats.add_bytes(produced=size)
            if stats._feeds is not None:
                stats._feeds.add_bytes(consumed=size)
    return result


def _one(result: Any) -> int:
    return 1


def _chunk_size(result: Any) -> int:
    return len(result.values)


def _as_list(result: Any) -> list:
    return [result]


def _chunk_elements(result: Any) -> list:
    return result.elements()


def _timed_next(method: Callable) -> Callable:
    @functools.wraps(method)
    def __next__(self):
        return _timed_call(self._stats, lambda: method(self), _one, _as_list)

    return __next__


def _timed_take(method: Callable) -> Callable:
    @functools.wraps(method)
    def take(self, k: int):
        return _timed_call(self._stats, lambda: method(self, k), _chunk_size, _chunk_elements)

    return take


def _timed_getitems(method: Callable) -> Callable:
    @functools.wraps(method)
    def _getitems(self, indices: Sequence[int]):
        return _timed_call(self._stats, lambda: method(self, indices), len, list)

    return _getitems


def _timed_getitem(method: Callable) -> Callable:
    @functools.wraps(method)
    def __getitem__(self, index: Any):
        if isinstance(index, slice):
            return method(self, index)
        return _timed_call(self._stats, lambda: method(self, index), _one, _as_list)

    return __getitem__


def _timed_iter_items(method: Callable) -> Callable:
    @functools.wraps(method)
    def _iter_items(self, indices: Sequence[int]):
        stats, elements = self._stats, []

        def step() -> Any:
            if not elements:  # made inside the first step: a _getitems it calls is this stage's own work
                elements.append(iter(method(self, indices)))
            return next(elements[0])

        while True:
            try:
                element = _timed_call(stats, step, _one, _as_list)
            except StopIteration:
                return
            yield element

    return _iter_items


_TIMERS = {"__next__": _timed_next, "take": _timed_take, "_getitems": _timed_getitems,
           "__getitem__": _timed_getitem, "_iter_items": _timed_iter_items}
_TIMED_CLASSES: dict = {}


def _new(cls: type, args: tuple, kwargs: dict) -> Any:
    return cls.__new__(cls, *args, **kwargs)


def _reduce_untimed(self: Any, protocol: int) -> Any:
    # Pickled (to workers, or copied) as the stage's own class, without statistics.
    timed, untimed = type(self), type(self)._untimed_class
    reduced = list(untimed.__reduce_ex__(self, protocol))
    if reduced[0] is copyreg.__newobj__:  # (pickle insists its class be the object's: another constructor)
        reduced[0:2] = _new, (untimed, reduced[1][1:], {})
    elif reduced[0] is copyreg.__newobj_ex__:
        reduced[0:2] = _new, (untimed, *reduced[1][1:])
    elif reduced[0] is timed:
        reduced[0] = untimed
    elif reduced[1] and reduced[1][0] is timed:
        reduced[1] = (untimed, *reduced[1][1:])
    if len(reduced) > 2 and isinstance(reduced[2], dict) and "_stats" in reduced[2]:
        reduced[2] = {k: v for k, v in reduced[2].items() if k != "_stats"}
    return tuple(reduced)


def _timed_class(cls: type) -> type:
    timed = _TIMED_CLASSES.get(cls)
    if timed is None:
        namespace = {name: timer(getattr(cls, name)) for name, timer in _TIMERS.items() if callable(getattr(cls, name, None))}
        namespace.update(__module__=cls.__module__, __qualname__=cls.__qualname__, __reduce_ex__=_reduce_untimed,
                         _untimed_class=cls)
        timed = _TIMED_CLASSES[cls] = type(cls)(cls.__name__, (cls,), namespace)
    return timed


def _is_stage(node: Any) -> bool:
    """Whether ``node`` is an iterator or a MapDataset (an IterDataset's stages run elsewhere: in workers)."""
    cls = type(node)
    return hasattr(cls, "__next__") or hasattr(cls, "_getitems")


def _inputs(node: Any) -> list:
    """The stages ``node`` reads from in this process: its parents, or the MapDataset ``to_iter_dataset()`` reads."""
    inputs = [p for p in getattr(node, "_parents", ()) if _is_stage(p)]
    return inputs or [p for p in (node.__dict__.get("_map_parent"),) if p is not None]


def _attach_stats(node: Any, log_summary: bool) -> ExecutionStats:
    parents = [_attach_stats(p, log_summary) for p in _inputs(node)]
    node_type = NodeType.PREFETCH if getattr(node, "_STATS_PREFETCH", False) else NodeType.DEFAULT
    config = StatsConfig(name=str(node), node_type=node_type, log_summary=log_summary,
                         iter_weakref=HashableWeakRef(node))
    stats = ExecutionStats(config, parents)
    stats._records_bytes = getattr(node, "_STATS_RECORDS_BYTES", False)
    worker_summaries = getattr(node, "worker_summaries", None)
    if worker_summaries is not None:
        stats._workers = weakref.WeakMethod(worker_summaries)
    if stats._records_bytes:
        # It consumes what its parents produce; with none here (workers), what it hands over.
        for parent in parents or [stats]:
            parent._feeds = stats
    node.__dict__["_stats"] = stats  # over the ``_stats`` property
    cls = type(node)
    if cls.__module__.startswith("grainlike.") and "_untimed_class" not in cls.__dict__:
        node.__class__ = _timed_class(cls)
    # Stages that hold a parent's bound method call it through the timed class.
    own = node.__dict__
    if own.get("_parent") is not None:
        if own.get("_pull") is not None:
            node._pull = own["_parent"].__next__
        if own.get("_take") is not None:
            node._take = own["_parent"].take
    return stats


def start_collecting(iterator: Any) -> None:
    """Gives every stage of ``iterator``'s tree its ``ExecutionStats`` and times grainlike's stages."""
    from grainlike.core.config import config

    _attach_stats(iterator, bool(config.py_debug_mode))


def get_execution_summary(ds_iter: Any) -> Any:
    """The ``ExecutionSummary`` of ``ds_iter``'s pipeline so far (grain's ``dataset.get_execution_summary``).

    Raises:
      ValueError: statistics are not collected (neither debug mode nor
        ``ExecutionTrackingMode.STAGE_TIMING``).
    """
    stats = ds_iter._stats
    if not isinstance(stats, ExecutionStats):
        raise ValueError(NOT_COLLECTED)
    return stats._get_execution_summary()
