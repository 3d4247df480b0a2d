"""Options for reading and for worker processes, with grain's names and defaults."""

from __future__ import annotations

import dataclasses


def _check_non_negative_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How each process reads records from the data source.

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


@dataclasses.dataclass(frozen=True)
class MultiprocessingOptions:
    """Worker processes.

    Attributes:
      num_workers: worker processes; 0 runs everything in the calling process.
      per_worker_buffer_size: finished outputs (batches) each worker keeps ready.
      enable_profiling: log per-stage timings of the workers.
      warm_start: while the workers start, compute their first outputs in the
        calling process (the same outputs, in the same order, with the same
        states), so the first batch does not wait for a worker to start. Off by
        default: with workers, transforms run only in the workers. grainlike
        only.
    """

    num_workers: int = 0
    per_worker_buffer_size: int = 1
    enable_profiling: bool = False
    warm_start: bool = False

    def __post_init__(self):
        _check_non_negative_int("num_workers", self.num_workers)
        _check_non_negative_int("per_worker_buffer_size", self.per_worker_buffer_size)
