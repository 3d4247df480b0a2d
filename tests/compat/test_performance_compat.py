"""``pick_performance_config``: grain's rule, from the elements' sizes and the RAM budget.

Each pipeline is built in both libraries and the chosen worker count and
read-ahead are compared with grain 0.2.18's.
"""

import dataclasses
import logging

import numpy as np
import pytest

from grainlike.dataset.nodes.options import MultiprocessingOptions, ReadOptions
from grainlike.experimental import PerformanceConfig, pick_performance_config
from tests.compat.dataset_pairs import GRAINLIKE, grain_namespace
from tests.compat.experimental_pairs import experimental

MB = 1 << 20


def _both(grain_ref, build, **kwargs):
    ours = pick_performance_config(build(GRAINLIKE), **kwargs)
    lib = grain_namespace(grain_ref)
    theirs = experimental(lib).pick_performance_config(build(lib), **kwargs)
    return ours, theirs


def _settings(config):
    return (
        config.multiprocessing_options.num_workers,
        config.read_options.num_threads,
        config.read_options.prefetch_buffer_size,
    )


def _arrays(lib, sizes_mb):
    return lib.MapDataset.source([np.zeros(int(s * MB), np.uint8) for s in sizes_mb])


def test_the_config_has_grains_fields_and_grainlikes_option_types(grain_ref):
    grain_fields = [f.name for f in dataclasses.fields(experimental(grain_namespace(grain_ref)).PerformanceConfig)]
    ours = [f.name for f in dataclasses.fields(PerformanceConfig)]
    assert ours[: len(grain_fields)] == grain_fields
    config = pick_performance_config(
        GRAINLIKE.MapDataset.range(20).to_iter_dataset(), ram_budget_mb=64, max_workers=2, max_buffer_size=None
    )
    assert isinstance(config.multiprocessing_options, MultiprocessingOptions)
    assert isinstance(config.read_options, ReadOptions)


@pytest.mark.parametrize(
    "sizes_mb, kwargs",
    [
        ([10] * 10, {"ram_budget_mb": 1024, "max_workers": 8, "max_buffer_size": None}),  # capped at 8
        ([100] * 6, {"ram_budget_mb": 1024, "max_workers": 64, "max_buffer_size": None}),  # the budget: 10
        ([1, 3, 5, 1, 3, 5], {"ram_budget_mb": 20, "max_workers": 64, "max_buffer_size": 3}),  # mean size
        ([2] * 8, {"ram_budget_mb": 1, "max_workers": 4, "max_buffer_size": None}),  # over budget: 0
        ([1] * 10, {"ram_budget_mb": 64, "max_workers": 4, "max_buffer_size": None, "samples_to_check": 2}),
    ],
)
def test_workers_and_read_ahead_are_the_ram_budget_over_the_element_size_as_reference(grain_ref, sizes_mb, kwargs):
    ours, theirs = _both(grain_ref, lambda lib: _arrays(lib, sizes_mb).to_iter_dataset(), **kwargs)
    assert _settings(ours) == _settings(theirs)


def test_read_ahead_is_sized_from_the_reads_under_each_to_iter_dataset_as_reference(grain_ref):
    def build(lib):
        batched = _arrays(lib, [1] * 10).to_iter_dataset().batch(2)  # elements of 2 MB, reads of 1 MB
        other = _arrays(lib, [3, 5] * 5).to_iter_dataset()
        return lib.IterDataset.mix([batched, other])

    ours, theirs = _both(grain_ref, build, ram_budget_mb=500, max_workers=64, max_buffer_size=None)
    assert _settings(ours) == _settings(theirs)


def test_too_few_elements_give_max_workers_and_max_buffer_size_as_reference(grain_ref, caplog):
    with caplog.at_level(logging.WARNING, logger="grainlike"):
        ours, theirs = _both(
            grain_ref,
            lambda lib: lib.MapDataset.source([1, 2, 3]).to_iter_dataset(),
            ram_budget_mb=1024,
            max_workers=6,
            max_buffer_size=40,
        )
    assert _settings(ours) == _settings(theirs) == (6, 16, 40)
    assert "fewer than samples_to_check=5" in caplog.text


def test_the_same_pipeline_gets_the_same_config_every_call():
    ds = GRAINLIKE.MapDataset.range(100).to_iter_dataset().map(lambda x: np.full(1000 + x, x))
    configs = {_settings(pick_performance_config(ds, ram_budget_mb=8, max_workers=None, max_buffer_size=None))
               for _ in range(3)}
    assert len(configs) == 1


def test_sizing_computes_only_the_elements_asked_for():
    seen = []
    ds = GRAINLIKE.MapDataset.range(100).map(lambda x: seen.append(x) or x).to_iter_dataset(
        GRAINLIKE.ReadOptions(num_threads=0)
    )
    pick_performance_config(ds, ram_budget_mb=64, max_workers=2, max_buffer_size=None, samples_to_check=3)
    assert seen == [0, 1, 2] * 2  # the pipeline's first 3, then the reads' first 3


def test_the_measurements_give_the_sizes_and_arithmetic(caplog):
    ds = _arrays(GRAINLIKE, [10] * 10).to_iter_dataset()
    with caplog.at_level(logging.INFO, logger="grainlike"):
        config = pick_performance_config(ds, ram_budget_mb=1024, max_workers=8, max_buffer_size=None)
    assert "num_workers=8 (int(1024 / 10) capped at max_workers=8)" in config.measurements
    assert "prefetch_buffer_size=102" in config.measurements
    assert config.measurements in caplog.text


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"samples_to_check": 0}, ValueError, "samples_to_check"),
        ({"ram_budget_mb": 0}, ValueError, "ram_budget_mb must be positive, got 0"),
        ({"ram_budget_mb": None}, TypeError, "ram_budget_mb must be a number of megabytes, got None"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(kwargs, error, match):
    args = {"ram_budget_mb": 64, "max_workers": 8, "max_buffer_size": None, **kwargs}
    with pytest.raises(error, match=match):
        pick_performance_config(GRAINLIKE.MapDataset.range(5).to_iter_dataset(), **args)
