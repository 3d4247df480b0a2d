"""Options for reading, for worker processes and for whole pipelines, with grain's names and defaults."""

from __future__ import annotations

import dataclasses
import enum
import logging
from typing import Any, Optional

from grainlike.core.errors import is_int
from grainlike.workers.liveness import DEFAULT_STALL_TIMEOUT_S


def _check_non_negative_int(name: str, value: object) -> None:
    # grain's words for a negative value (its tests match them), not check_int's.
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How each process reads records from the data source.

    A given ``ReadOptions`` is used as it is, as in grain. Without one, these
    defaults apply where some of the work waits, and local CPU-bound work is read
    in the calling thread (see ``grainlike.dataset.transformations.read_threads``).

    Attributes:
      num_threads: read-ahead threads per process. Threads help when reads wait on
        I/O (files on slow disks, remote storage); for data already in memory use 0.
        grainlike reads keys in batches (``__getitems__``), so a few threads go far.
      prefetch_buffer_size: how many records each process reads ahead of use.

    Example:
      >>> ReadOptions(num_threads=0).prefetch_buffer_size
      500
    """

    num_threads: int = 16
    prefetch_buffer_size: int = 500

    def __post_init__(self):
        _check_non_negative_int("num_threads", self.num_threads)
        _check_non_negative_int("prefetch_buffer_size", self.prefetch_buffer_size)
        # As grain: a buffer smaller than the threads idles threads; 0 (no
        # read-ahead) is a usual choice and is not warned about.
        if 0 < self.prefetch_buffer_size < self.num_threads:
            logging.getLogger("grainlike").warning(
                "prefetch_buffer_size=%d is smaller than num_threads=%d. This will limit the number of "
                "threads that can actually be used in parallel to %d, potentially hurting performance. "
                "Please set prefetch_buffer_size >= num_threads.",
                self.prefetch_buffer_size,
                self.num_threads,
                self.prefetch_buffer_size,
            )


@dataclasses.dataclass(frozen=True)
class MultiprocessingOptions:
    """Worker processes.

    Attributes:
      num_workers: worker processes; 0 runs everything in the calling process.
      per_worker_buffer_size: finished outputs (batches) each worker keeps ready.
      enable_profiling: log per-stage timings of the workers.
      warm_start: while the workers start, compute their first outputs (the same
        outputs and states) in the calling process. Off by default: with workers,
        transforms run only in the workers. grainlike only.
      stall_timeout_s: a worker whose executing line does not change for this
        many seconds while its output is awaited raises ``WorkerStalledError``
        naming the worker, its pid, state and stack; a slow worker that keeps
        moving is never reported, and one still starting gets at least 60 s.
        ``None`` or 0 turns the check off. grainlike only.
      restart_dead_workers: ``mp_prefetch`` only: restart workers that died from
        the state after the last delivered element (up to 3 times in a row
        without an element in between, then ``WorkerDiedError``); off, the death
        is raised by every later ``next()``. grainlike only.
    """

    num_workers: int = 0
    per_worker_buffer_size: int = 1
    enable_profiling: bool = False
    # grainlike-only fields stay out of the repr, which is grain's.
    warm_start: bool = dataclasses.field(default=False, repr=False)
    stall_timeout_s: Optional[float] = dataclasses.field(default=DEFAULT_STALL_TIMEOUT_S, repr=False)
    restart_dead_workers: bool = dataclasses.field(default=False, repr=False)

    def __post_init__(self):
        _check_non_negative_int("num_workers", self.num_workers)
        _check_non_negative_int("per_worker_buffer_size", self.per_worker_buffer_size)
        timeout = self.stall_timeout_s
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0
        ):
            raise ValueError(
                f"stall_timeout_s must be a number of seconds >= 0, or None to turn the "
                f"check off; got {timeout!r}"
            )
        if not isinstance(self.restart_dead_workers, bool):
            raise ValueError(f"restart_dead_workers must be True or False, got {self.restart_dead_workers!r}")


class ExecutionTrackingMode(enum.Enum):
    """grain's per-stage timing modes: ``STAGE_TIMING`` collects execution statistics (``get_execution_summary``)."""

    DISABLED = enum.auto()
    STAGE_TIMING = enum.auto()


@dataclasses.dataclass(frozen=True)
class _Default:
    """Marks a field the user left at its default (so a merge can tell)."""

    value: object


@dataclasses.dataclass(kw_only=True, frozen=True)
class DatasetOptions:
    """Options for every stage of a Dataset pipeline (grain's ``DatasetOptions``).

    Attributes:
      filter_warn_threshold_ratio: log a warning when filters (``filter``, and the
        ``None`` a ``MapDataset`` filter leaves) remove at least this share of a
        window of 1000 elements; None disables it.
      filter_raise_threshold_ratio: raise ``ValueError`` at that share instead;
        None (the default) disables it.
      execution_tracking_mode: ``ExecutionTrackingMode.STAGE_TIMING`` collects
        execution statistics of the iterators made after it is set
        (``grainlike.dataset.execution_stats``).
      min_shm_size: arrays smaller than this many bytes are copied between
        processes instead of passed in shared memory.

    Example:
      >>> DatasetOptions(min_shm_size=1024).merge(DatasetOptions(min_shm_size=8)).min_shm_size
      1024
    """

    filter_warn_threshold_ratio: Any = _Default(0.9)
    filter_raise_threshold_ratio: Any = _Default(None)
    execution_tracking_mode: Any = _Default(ExecutionTrackingMode.DISABLED)
    min_shm_size: Any = _Default(0)
    # The fields the user set, which win a merge over defaults.
    _user_set_fields: frozenset = dataclasses.field(default=frozenset(), init=False, repr=False, compare=False)

    def __post_init__(self):
        user_set = set()
        for field in dataclasses.fields(self):
            if not field.init:
                continue
            value = getattr(self, field.name)
            if isinstance(value, _Default):
                object.__setattr__(self, field.name, value.value)
            else:
                user_set.add(field.name)
        object.__setattr__(self, "_user_set_fields", frozenset(user_set))

    def __repr__(self) -> str:
        # grain's dataclass repr, which shows the set fields (as a set, in field order).
        fields = [f for f in dataclasses.fields(self) if f.init]
        user_set = set()
        for f in fields:
            if f.name in self._user_set_fields:
                user_set.add(f.name)
        values = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields)
        return f"DatasetOptions({values}, _user_set_fields={user_set!r})"

    def merge(self, other: Optional["DatasetOptions"]) -> "DatasetOptions":
        """These options over ``other``'s: set fields of ``self``, then of ``other``, then defaults."""
        if other is None:
            return self
        merged = {}
        for field in dataclasses.fields(self):
            if field.name in self._user_set_fields:
                merged[field.name] = getattr(self, field.name)
            elif field.name in other._user_set_fields:
                merged[field.name] = getattr(other, field.name)
        return DatasetOptions(**merged)
