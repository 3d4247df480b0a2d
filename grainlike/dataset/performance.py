"""``pick_performance_config``: worker and read-ahead settings from measurements.

grain 0.2.18's function sizes the settings from the elements' sizes and a RAM
budget. grainlike's takes the same arguments and returns the same types, and
decides from what it measures on this machine when it is called:

* the pipeline's cost per element, timed in this process over a few elements
  (``samples_to_check``, after one first element that may pay for opening files);
* what handing one element to a worker process costs (pickled, through a pipe,
  unpickled);
* whether reading the source waits (the reads under each ``to_iter_dataset()``
  block, and take longer than their CPU time);
* the number of CPUs this process may use, and the elements' sizes (as grain).

Workers are chosen when an element costs more to compute than to hand over:
as many as there are CPUs, at most ``max_workers`` and at most what the RAM
budget holds (grain's rule). Read threads are chosen when reading waits (files,
remote storage): about ``wall / cpu`` of them, at most 16. The read-ahead buffer
is grain's: the RAM budget over the elements' size, at most ``max_buffer_size``.

The result holds what was measured (``config.measurements``) and is logged on
the ``grainlike`` logger. Timings vary from run to run: a program configures the
same way every run only if it saves the returned config and reuses it. Nothing
else in grainlike times anything to decide how to run.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import pickle
import sys
import time
from typing import Any, Optional

import numpy as np

from grainlike.dataset.options import MultiprocessingOptions, ReadOptions

_logger = logging.getLogger("grainlike")

_MAX_READ_THREADS = 16
# Reading waits this many times longer than it computes before threads are used.
_WAIT_RATIO_FOR_THREADS = 1.5
# Measuring stops after this long, even with fewer elements than asked for.
_MEASURE_BUDGET_S = 5.0
# Fits a pipe's buffer, so one thread can write and then read it back.
_PIPE_CHUNK = 1 << 15


@dataclasses.dataclass(slots=True)
class PerformanceConfig:
    """The settings ``pick_performance_config`` chose.

    Attributes:
      multiprocessing_options: for ``ds.mp_prefetch(...)``.
      read_options: for ``to_iter_dataset(...)``.
      measurements: what was measured, and why these settings (grainlike only).
    """

    multiprocessing_options: Optional[MultiprocessingOptions] = None
    read_options: Optional[ReadOptions] = None
    measurements: Optional[str] = dataclasses.field(default=None, compare=False)


def _element_size_bytes(element: Any) -> int:
    """The bytes of an element: arrays' data, ``sys.getsizeof`` of other leaves (grain's)."""
    if isinstance(element, dict):
        return sum(_element_size_bytes(v) for v in element.values())
    if isinstance(element, (list, tuple)):
        return sum(_element_size_bytes(v) for v in element)
    if isinstance(element, np.ndarray):
        return element.nbytes
    return sys.getsizeof(element)


@dataclasses.dataclass
class _Timing:
    elements: list
    first_s: float
    per_element_s: float
    per_element_cpu_s: float


def _time_elements(ds: Any, count: int) -> _Timing:
    """Iterates a fresh iterator of ``ds`` for up to ``1 + count`` elements, timing each."""
    it = iter(ds)
    elements: list = []
    first_s = 0.0
    wall = cpu = 0.0
    timed = 0
    deadline = time.perf_counter() + _MEASURE_BUDGET_S
    try:
        for i in range(count + 1):
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                element = next(it)
            except StopIteration:
                break
            w1, c1 = time.perf_counter(), time.process_time()
            elements.append(element)
            if i == 0:
                first_s = w1 - w0
            else:
                wall += w1 - w0
                cpu += c1 - c0
                timed += 1
            if w1 > deadline:
                break
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    if not timed:  # One element only: its time is all there is.
        return _Timing(elements, first_s, first_s, first_s)
    return _Timing(elements, first_s, wall / timed, cpu / timed)


def _handover_s(elements: list) -> float:
    """Seconds to hand one element to another process, as grainlike's workers do.

    Array data is copied once (workers write it into shared memory); the rest is
    pickled, sent through a pipe and unpickled.
    """
    if not elements:
        return 0.0
    read_fd, write_fd = os.pipe()
    try:
        start = time.perf_counter()
        for e in elements:
            buffers: list = []
            data = memoryview(pickle.dumps(e, protocol=5, buffer_callback=buffers.append))
            copies = [np.array(b.raw(), copy=True) for b in buffers]
            received = bytearray()
            for offset in range(0, len(data), _PIPE_CHUNK):
                os.write(write_fd, data[offset : offset + _PIPE_CHUNK])
                received += os.read(read_fd, _PIPE_CHUNK)
            pickle.loads(received, buffers=copies)
        return (time.perf_counter() - start) / len(elements)
    finally:
        os.close(read_fd)
        os.close(write_fd)


def _blocking_switches() -> int:
    """Times this thread has blocked so far (voluntary context switches)."""
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    except (ImportError, AttributeError, OSError):
        return 0


def _read_parents(ds: Any) -> list:
    """The MapDatasets under each ``to_iter_dataset()`` in ``ds``: the source reads."""
    from grainlike.dataset.prefetch import PrefetchIterDataset

    if isinstance(ds, PrefetchIterDataset):
        return [ds._parent]
    found = []
    for parent in getattr(ds, "_parents", ()):
        found.extend(_read_parents(parent))
    return found


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _available_ram_mb() -> float:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except (ValueError, OSError, AttributeError):
        return 4096.0


def _mean_size_mb(elements: list) -> float:
    if not elements:
        return 0.0
    return float(np.mean([_element_size_bytes(e) for e in elements])) / (1 << 20)


def pick_performance_config(
    ds: Any,
    *,
    ram_budget_mb: Optional[int],
    max_workers: Optional[int],
    max_buffer_size: Optional[int],
    samples_to_check: int = 5,
) -> PerformanceConfig:
    """Chooses worker processes, read threads and read-ahead for ``ds`` by measuring it.

    Pass the pipeline as it will run before ``mp_prefetch``; its first
    ``samples_to_check + 1`` elements are computed here, in this process.

    Args:
      ds: the dataset (an ``IterDataset``).
      ram_budget_mb: memory the buffered elements may use; ``None``: half of
        the memory available now.
      max_workers: at most this many workers; ``None``: the usable CPUs.
      max_buffer_size: at most this read-ahead; ``None``: 1000 (grain's).
      samples_to_check: elements timed and sized.

    Returns:
      A ``PerformanceConfig``; ``measurements`` says what was measured.

    Raises:
      ValueError: ``samples_to_check < 1`` or ``ram_budget_mb <= 0``.

    Example:
      >>> from grainlike.dataset import MapDataset
      >>> config = pick_performance_config(
      ...     MapDataset.range(100).to_iter_dataset().map(lambda x: x + 1),
      ...     ram_budget_mb=64, max_workers=4, max_buffer_size=None)
      >>> config.multiprocessing_options.num_workers  # too cheap to hand to a worker
      0
    """
    if samples_to_check < 1:
        raise ValueError(f"samples_to_check must be at least 1, got {samples_to_check}")
    if ram_budget_mb is not None and ram_budget_mb <= 0:
        raise ValueError(f"ram_budget_mb must be positive, got {ram_budget_mb}")
    budget_mb = float(ram_budget_mb) if ram_budget_mb is not None else _available_ram_mb() / 2
    cpus = _usable_cpus()
    max_workers = cpus if max_workers is None else max_workers
    max_buffer_size = 1000 if max_buffer_size is None else max_buffer_size

    timing = _time_elements(ds, samples_to_check)
    handover_s = _handover_s(timing.elements)
    size_mb = _mean_size_mb(timing.elements)

    # Workers: only if computing an element costs more than handing it over.
    ram_workers = int(budget_mb / size_mb) if size_mb > 0 else max_workers
    worth_workers = timing.per_element_s > handover_s
    num_workers = min(cpus, max_workers, ram_workers) if worth_workers else 0
    num_workers = max(num_workers, 0)

    # Read threads and read-ahead, from the reads under to_iter_dataset().
    parents = _read_parents(ds)
    read_wall = read_cpu = 0.0
    read_elements: list = []
    per_parent = math.ceil(samples_to_check / len(parents)) if parents else 0
    blocked = _blocking_switches()
    for parent in parents:
        n = min(per_parent, len(parent))
        w0, c0 = time.perf_counter(), time.thread_time()
        read_elements.extend(parent[i] for i in range(n))
        read_wall += time.perf_counter() - w0
        read_cpu += time.thread_time() - c0
    blocked = _blocking_switches() - blocked
    wait_ratio = read_wall / read_cpu if read_cpu > 0 else (math.inf if read_wall > 0 else 1.0)
    # Reads wait if they block (I/O, sleeps): a read that is only slowed down by
    # other busy processes is preempted instead, and threads would not help it.
    reads_block = blocked >= max(1, len(read_elements) // 2)
    if reads_block and wait_ratio >= _WAIT_RATIO_FOR_THREADS:
        threads = _MAX_READ_THREADS if not math.isfinite(wait_ratio) else min(_MAX_READ_THREADS, math.ceil(wait_ratio))
    else:
        threads = 0
    read_size_mb = _mean_size_mb([e for e in read_elements if e is not None])
    if parents and read_size_mb > 0:
        buffer_size = min(int(budget_mb / (read_size_mb * len(parents))), max_buffer_size)
    else:
        buffer_size = max_buffer_size

    why_workers = (
        "compute costs more than the handover" if worth_workers else "cheaper to compute here than to hand over"
    )
    measurements = (
        f"{len(timing.elements)} elements computed: first {timing.first_s * 1e3:.3f} ms, then "
        f"{timing.per_element_s * 1e6:.1f} us each ({timing.per_element_cpu_s * 1e6:.1f} us CPU); "
        f"handing one to a worker {handover_s * 1e6:.1f} us; {size_mb * 1024:.1f} KiB each; "
        f"{cpus} usable CPUs; RAM budget {budget_mb:.0f} MB -> num_workers={num_workers} "
        f"({why_workers}). "
        f"Reads under {len(parents)} to_iter_dataset(): wall/CPU time {wait_ratio:.2f}, blocked {blocked} "
        f"times in {len(read_elements)} reads -> "
        f"num_threads={threads}, prefetch_buffer_size={buffer_size}."
    )
    _logger.info("pick_performance_config: %s", measurements)
    return PerformanceConfig(
        multiprocessing_options=MultiprocessingOptions(num_workers=num_workers),
        read_options=ReadOptions(num_threads=threads, prefetch_buffer_size=buffer_size),
        measurements=measurements,
    )
