"""``pick_performance_config``: grain's names and types, decided from measurements.

grain sizes its settings from the elements' sizes only; where grainlike's choice
comes from the same sizes (the RAM budget's bound on workers, the read-ahead
buffer) it is compared with grain's. The rest is checked against pipelines whose
costs are far apart: cheap to compute and costly to hand over, blocked on a
sleep, reading from a source that blocks.
"""

import dataclasses
import logging
import time

import numpy as np
import pytest

from grainlike.dataset.options import MultiprocessingOptions, ReadOptions
from grainlike.experimental import PerformanceConfig, pick_performance_config
from tests.compat.dataset_pairs import GRAINLIKE, grain_namespace
from tests.compat.experimental_pairs import experimental

BIG = {f"k{i}": list(range(50)) for i in range(40)}  # Costly to pickle, free to return.


def _pick(ds, **kwargs):
    args = {"ram_budget_mb": 64, "max_workers": 8, "max_buffer_size": None}
    args.update(kwargs)
    return pick_performance_config(ds, **args)


def _sleepy(x):
    time.sleep(0.02)
    return np.zeros(1 << 18, np.float32)  # 1 MiB


def test_the_config_has_grains_fields_and_grainlikes_option_types(grain_ref):
    grain_fields = [f.name for f in dataclasses.fields(experimental(grain_namespace(grain_ref)).PerformanceConfig)]
    ours = [f.name for f in dataclasses.fields(PerformanceConfig)]
    assert ours[: len(grain_fields)] == grain_fields
    config = _pick(GRAINLIKE.MapDataset.range(20).to_iter_dataset())
    assert isinstance(config.multiprocessing_options, MultiprocessingOptions)
    assert isinstance(config.read_options, ReadOptions)


def test_elements_cheaper_to_compute_than_to_hand_over_get_no_workers(caplog):
    ds = GRAINLIKE.MapDataset.range(50).to_iter_dataset().map(lambda x: BIG)
    with caplog.at_level(logging.INFO, logger="grainlike"):
        config = _pick(ds)
    assert config.multiprocessing_options.num_workers == 0
    # It says what it measured, on the object and in the log.
    assert "us each" in config.measurements and "usable CPUs" in config.measurements
    assert "handing one to a worker" in config.measurements
    assert config.measurements in caplog.text


def test_costly_elements_get_a_worker_per_cpu_within_max_workers():
    import os

    cpus = len(os.sched_getaffinity(0))
    ds = GRAINLIKE.MapDataset.range(50).to_iter_dataset().map(lambda x: (time.sleep(0.02), x)[1])
    assert _pick(ds).multiprocessing_options.num_workers == min(cpus, 8)
    assert _pick(ds, max_workers=1).multiprocessing_options.num_workers == 1


def test_the_ram_budget_bounds_the_workers_as_reference(grain_ref):
    # 1 MiB elements in a 1 MB budget: one worker, in both libraries.
    def build(lib):
        return lib.MapDataset.range(20).to_iter_dataset().map(_sleepy)

    ours = _pick(build(GRAINLIKE), ram_budget_mb=1)
    theirs = experimental(grain_namespace(grain_ref)).pick_performance_config(
        build(grain_namespace(grain_ref)), ram_budget_mb=1, max_workers=8, max_buffer_size=None
    )
    assert ours.multiprocessing_options.num_workers == theirs.multiprocessing_options.num_workers == 1


@pytest.mark.parametrize("ram_budget_mb, max_buffer_size", [(8, None), (1, None), (64, 100)])
def test_the_read_ahead_is_sized_as_reference(grain_ref, ram_budget_mb, max_buffer_size):
    def build(lib):
        ds = lib.MapDataset.range(100).map(lambda x: np.zeros(1 << 16, np.uint8))
        return ds.to_iter_dataset().batch(2)

    kwargs = {"ram_budget_mb": ram_budget_mb, "max_workers": 2, "max_buffer_size": max_buffer_size}
    ours = pick_performance_config(build(GRAINLIKE), **kwargs)
    theirs = experimental(grain_namespace(grain_ref)).pick_performance_config(
        build(grain_namespace(grain_ref)), **kwargs
    )
    assert ours.read_options.prefetch_buffer_size == theirs.read_options.prefetch_buffer_size


class _BlockingSource:
    def __len__(self):
        return 50

    def __getitem__(self, i):
        time.sleep(0.005)  # A read that waits, as on a remote file.
        return i


def test_reads_that_block_get_read_threads_and_reads_in_memory_get_none():
    blocking = _pick(GRAINLIKE.MapDataset.source(_BlockingSource()).to_iter_dataset())
    assert blocking.read_options.num_threads > 1
    in_memory = _pick(GRAINLIKE.MapDataset.source(list(range(50))).to_iter_dataset())
    assert in_memory.read_options.num_threads == 0


def test_measuring_computes_only_the_elements_asked_for():
    seen = []
    ds = GRAINLIKE.MapDataset.range(100).to_iter_dataset().map(lambda x: seen.append(x) or x)
    _pick(ds, samples_to_check=3)
    assert seen == [0, 1, 2, 3]


@pytest.mark.parametrize("kwargs", [{"samples_to_check": 0}, {"ram_budget_mb": 0}])
def test_bad_arguments_raise_value_error(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        _pick(GRAINLIKE.MapDataset.range(5).to_iter_dataset(), **kwargs)
