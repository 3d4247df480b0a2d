"""Running one Dataset pipeline in grain and in grainlike, and comparing the runs.

A pipeline is a function of a namespace ``lib`` holding one library's names
(``lib.MapDataset``, ``lib.Map``, ...), so the same code builds both pipelines.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import numpy as np

import grainlike.dataset as gd
from grainlike.core import transforms as gt
from grainlike.dataset.transformations.batch import batch_and_pad
from grainlike.dataset.transformations.flatmap import FlatMapIterDataset, FlatMapMapDataset
from grainlike.dataset.transformations.limit import LimitIterDataset
from grainlike.dataset.nodes.options import DatasetOptions
from grainlike.dataset.transformations.seed import WithOptionsIterDataset
from grainlike.dataset.transformations.repeat import RepeatIterDataset
from grainlike.dataset.transformations.shuffle import WindowShuffleIterDataset, WindowShuffleMapDataset
from grainlike.dataset.transformations.thread_prefetch import ThreadPrefetchIterDataset
from grainlike.dataset.transformations.zip import ZipIterDataset, ZipMapDataset
from grainlike.dataset.nodes.options import MultiprocessingOptions, ReadOptions
from tests.helpers.leaf_types import type_name

GRAINLIKE = types.SimpleNamespace(
    name="grainlike",
    MapDataset=gd.MapDataset,
    IterDataset=gd.IterDataset,
    DatasetSelectionMap=gd.DatasetSelectionMap,
    ReadOptions=ReadOptions,
    MultiprocessingOptions=MultiprocessingOptions,
    Map=gt.MapTransform,
    RandomMap=gt.RandomMapTransform,
    Filter=gt.FilterTransform,
    MapWithIndex=gt.MapWithIndexTransform,
    Batch=gt.Batch,
    get_next_index=gd.get_next_index,
    set_next_index=gd.set_next_index,
    LimitIterDataset=LimitIterDataset,
    RepeatIterDataset=RepeatIterDataset,
    WindowShuffleMapDataset=WindowShuffleMapDataset,
    WindowShuffleIterDataset=WindowShuffleIterDataset,
    ZipMapDataset=ZipMapDataset,
    ZipIterDataset=ZipIterDataset,
    batch_and_pad=batch_and_pad,
    ThreadPrefetchIterDataset=ThreadPrefetchIterDataset,
    FlatMapMapDataset=FlatMapMapDataset,
    FlatMapIterDataset=FlatMapIterDataset,
    # Stages take any object with flat_map() and max_fan_out, as grain does.
    FlatMap=getattr(gt, "FlatMap", object),
    DatasetOptions=DatasetOptions,
    WithOptionsIterDataset=WithOptionsIterDataset,
)


def grain_namespace(grain: Any) -> types.SimpleNamespace:
    """The same names from ``grain.python`` 0.2.18."""
    return types.SimpleNamespace(
        name="grain",
        MapDataset=grain.MapDataset,
        IterDataset=grain.IterDataset,
        DatasetSelectionMap=grain.DatasetSelectionMap,
        ReadOptions=grain.ReadOptions,
        MultiprocessingOptions=grain.MultiprocessingOptions,
        Map=grain.MapTransform,
        RandomMap=grain.RandomMapTransform,
        Filter=grain.FilterTransform,
        MapWithIndex=grain.experimental.MapWithIndexTransform,
        Batch=grain.Batch,
        get_next_index=grain.experimental.get_next_index,
        set_next_index=grain.experimental.set_next_index,
        **{
            name: getattr(grain.experimental, name)
            for name in (
                "LimitIterDataset",
                "RepeatIterDataset",
                "WindowShuffleMapDataset",
                "WindowShuffleIterDataset",
                "ZipMapDataset",
                "ZipIterDataset",
                "batch_and_pad",
                "ThreadPrefetchIterDataset",
                "FlatMapMapDataset",
                "FlatMapIterDataset",
                "DatasetOptions",
                "WithOptionsIterDataset",
            )
        },
        FlatMap=grain.experimental.FlatMapTransform,
    )


def assert_same(expected: Any, actual: Any, path: str = "") -> None:
    """Equal values of the same types (``type_name``), arrays with the same dtype and shape."""
    assert type_name(expected) == type_name(actual), f"{path}: {type_name(expected)} != {type_name(actual)}"
    if isinstance(expected, np.ndarray):
        assert expected.dtype == actual.dtype and expected.shape == actual.shape, (
            f"{path}: {expected.dtype}{expected.shape} != {actual.dtype}{actual.shape}"
        )
        np.testing.assert_array_equal(expected, actual, err_msg=path)
        return
    if isinstance(expected, dict):
        assert expected.keys() == actual.keys(), path
        for k in expected:
            assert_same(expected[k], actual[k], f"{path}[{k!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(expected) == len(actual), f"{path}: length {len(expected)} != {len(actual)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_same(e, a, f"{path}[{i}]")
    else:
        assert expected == actual, f"{path}: {expected!r} != {actual!r}"


def run(ds: Any, limit: int = 10_000) -> tuple[list, list]:
    """Elements of ``iter(ds)`` and the state before each (plus the final state)."""
    it = iter(ds)
    values, states = [], []
    for _ in range(limit):
        states.append(it.get_state())
        try:
            values.append(next(it))
        except StopIteration:
            break
    else:
        states.append(it.get_state())
    return values, states


def rest(it: Any, limit: int = 10_000) -> list:
    out = []
    for _ in range(limit):
        try:
            out.append(next(it))
        except StopIteration:
            break
    return out


def check_pipeline(build: Callable[[Any], Any], grain_lib: Any, restore_at: int = 4) -> list:
    """Asserts same elements and states at every step, and cross-restores both ways.

    Returns the elements.
    """
    g_ds, l_ds = build(grain_lib), build(GRAINLIKE)
    g_values, g_states = run(g_ds)
    l_values, l_states = run(l_ds)
    assert_same(g_values, l_values, "elements")
    assert g_states == l_states
    n = len(g_values)
    points = sorted({0, n // 3, n // 2, max(n - 1, 0), n}) if restore_at else []
    for k in points:
        it = iter(l_ds)
        it.set_state(g_states[k])
        assert_same(g_values[k:], rest(it), f"grainlike restored from grain's state {k}")
        it = iter(g_ds)
        it.set_state(l_states[k])
        assert_same(l_values[k:], rest(it), f"grain restored from grainlike's state {k}")
    return l_values
