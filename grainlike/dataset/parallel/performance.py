"""``pick_performance_config``: worker and read-ahead settings from a RAM budget.

grain 0.2.18's rule, from the elements' sizes and the RAM budget only (nothing is
timed): ``num_workers = int(ram_budget_mb / element MB)`` and
``prefetch_buffer_size = int(ram_budget_mb / (read MB * reads))``, capped by
``max_workers`` and ``max_buffer_size``, which also apply when no size is found.
Sizes are grain's: arrays' ``nbytes`` and ``sys.getsizeof`` of other leaves.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import sys
from typing import Any, Optional

import numpy as np

from grainlike.core.protocols import close_if_closeable
from grainlike.dataset.nodes.options import MultiprocessingOptions, ReadOptions

_logger = logging.getLogger("grainlike")

_DEFAULT_MAX_BUFFER_SIZE = 1000
_BYTES_PER_MB = 1 << 20


@dataclasses.dataclass(slots=True)
class PerformanceConfig:
    """The settings ``pick_performance_config`` chose.

    Attributes:
      multiprocessing_options: for ``ds.mp_prefetch(...)``.
      read_options: for ``to_iter_dataset(...)``.
      measurements: the sizes found and the arithmetic behind the settings
        (grainlike only).
    """

    multiprocessing_options: Optional[MultiprocessingOptions] = None
    read_options: Optional[ReadOptions] = None
    measurements: Optional[str] = dataclasses.field(default=None, compare=False)


def _element_size_bytes(element: Any) -> int:
    if isinstance(element, dict):
        return sum(_element_size_bytes(v) for v in element.values())
    if isinstance(element, (list, tuple)):
        return sum(_element_size_bytes(v) for v in element)
    if isinstance(element, np.ndarray):
        return element.nbytes
    return sys.getsizeof(element)


def _first_elements(ds: Any, count: int) -> list:
    """The first ``count`` elements of a fresh iterator of ``ds``, computing no more in threads."""
    from grainlike.dataset.nodes.map_dataset import MapDataset

    if isinstance(ds, MapDataset):
        ds = ds.to_iter_dataset(ReadOptions(num_threads=0))
    it = iter(ds)
    try:
        return list(itertools.islice(it, count))
    finally:
        close_if_closeable(it)


def _mean_size_mb(datasets: list, samples_to_check: int) -> float:
    """Mean size in MB of ``ceil(samples_to_check / len(datasets))`` elements of each; 0 if too few."""
    if not datasets:
        return 0.0
    per_dataset = math.ceil(samples_to_check / len(datasets))
    elements = [e for ds in datasets for e in _first_elements(ds, per_dataset)]
    if len(elements) < samples_to_check:
        _logger.warning(
            "pick_performance_config: %d elements to size, fewer than samples_to_check=%d",
            len(elements),
            samples_to_check,
        )
        return 0.0
    return float(np.mean([_element_size_bytes(e) for e in elements])) / _BYTES_PER_MB


def _read_parents(ds: Any) -> list:
    """The MapDatasets under each ``to_iter_dataset()`` in ``ds``: the source reads."""
    from grainlike.dataset.transformations.prefetch import PrefetchIterDataset

    if isinstance(ds, PrefetchIterDataset):
        return [ds._parent]
    return [read for parent in ds.parents for read in _read_parents(parent)]


def pick_performance_config(
    ds: Any,
    *,
    ram_budget_mb: Optional[int],
    max_workers: Optional[int],
    max_buffer_size: Optional[int],
    samples_to_check: int = 5,
) -> PerformanceConfig:
    """Chooses worker processes and read-ahead for ``ds`` from a RAM budget (grain's rule).

    Pass the pipeline as it will run before ``mp_prefetch``; its first
    ``samples_to_check`` elements, and as many from the reads under its
    ``to_iter_dataset()`` stages, are computed here, in this process, to be sized.

    Args:
      ds: the dataset (an ``IterDataset``).
      ram_budget_mb: megabytes the buffered elements may use.
      max_workers: at most this many workers; ``None``: ``os.cpu_count()``.
      max_buffer_size: at most this read-ahead; ``None``: 1000.
      samples_to_check: elements sized.

    Returns:
      A ``PerformanceConfig``; ``measurements`` gives the sizes and arithmetic.

    Raises:
      ValueError: ``samples_to_check < 1`` or ``ram_budget_mb <= 0``.
      TypeError: ``ram_budget_mb`` is not a number (grain raises it too).

    Example:
      >>> import numpy as np
      >>> from grainlike.dataset import MapDataset
      >>> ds = MapDataset.source([np.zeros(10 << 20, np.uint8)] * 10).to_iter_dataset()
      >>> config = pick_performance_config(ds, ram_budget_mb=1024, max_workers=8, max_buffer_size=None)
      >>> config.multiprocessing_options.num_workers  # int(1024 / 10), at most 8
      8
      >>> config.read_options.prefetch_buffer_size  # int(1024 / 10)
      102
    """
    if samples_to_check < 1:
        raise ValueError(f"samples_to_check must be at least 1, got {samples_to_check}")
    if isinstance(ram_budget_mb, bool) or not isinstance(ram_budget_mb, (int, float)):
        raise TypeError(f"ram_budget_mb must be a number of megabytes, got {ram_budget_mb!r}")
    if ram_budget_mb <= 0:
        raise ValueError(f"ram_budget_mb must be positive, got {ram_budget_mb}")
    if max_workers is None:
        max_workers = os.cpu_count() or 1
    if max_buffer_size is None:
        max_buffer_size = _DEFAULT_MAX_BUFFER_SIZE

    size_mb = _mean_size_mb([ds], samples_to_check)
    if size_mb > 0:
        num_workers = min(int(ram_budget_mb / size_mb), max_workers)
        why_workers = f"int({ram_budget_mb} / {size_mb:.4g}) capped at max_workers={max_workers}"
    else:
        num_workers = max_workers
        why_workers = "no size found: max_workers"

    parents = _read_parents(ds)
    read_size_mb = _mean_size_mb(parents, samples_to_check)
    if read_size_mb > 0:
        buffer_size = min(int(ram_budget_mb / (read_size_mb * len(parents))), max_buffer_size)
        why_buffer = (
            f"int({ram_budget_mb} / ({read_size_mb:.4g} * {len(parents)} reads)) "
            f"capped at max_buffer_size={max_buffer_size}"
        )
    else:
        buffer_size = max_buffer_size
        why_buffer = f"no read size found under {len(parents)} to_iter_dataset(): max_buffer_size"

    measurements = (
        f"elements of {size_mb:.4g} MB -> num_workers={num_workers} ({why_workers}); "
        f"reads of {read_size_mb:.4g} MB -> prefetch_buffer_size={buffer_size} ({why_buffer})."
    )
    _logger.info("pick_performance_config: %s", measurements)
    return PerformanceConfig(
        multiprocessing_options=MultiprocessingOptions(num_workers=num_workers),
        read_options=ReadOptions(prefetch_buffer_size=buffer_size),
        measurements=measurements,
    )
