"""The types of delivered leaves equal grain 0.2.18's, for every way of running a pipeline.

Each case builds one pipeline in grain and in grainlike from the same recipe,
iterates over all of it and compares, for every element, the type of every node
and leaf (``tests.helpers.leaf_types``) with dtype, shape and memory order:
plain ``numpy.ndarray``s in process and from read threads, grain's
``SharedMemoryArray`` for what workers hand over (a DataLoader with
``worker_count > 0``, ``mp_prefetch``), ``jax.Array``s from ``device_put``.

grain's workers are spawned processes that import JAX (seconds each), so the
cases with workers pack many kinds of leaves into one record.
"""

from __future__ import annotations

import collections
import dataclasses
import functools

import numpy as np
import pytest

import grainlike
from tests.helpers.leaf_types import leaf_types

pytestmark = pytest.mark.timeout(600)

N = 4

Pair = collections.namedtuple("Pair", "small big")


@dataclasses.dataclass
class Boxed:
    values: np.ndarray


def record(i: int) -> dict:
    """One leaf of each kind a record holds, with the layouts that decide grain's hand-off."""
    return {
        "small": np.arange(3, dtype=np.float32) + i,
        "big": np.full((128, 128), i, np.float32),  # 64 KiB: a segment of its own in grainlike
        "zero_d": np.array(i),
        "int": i,
        "float": float(i),
        "bool": True,
        "np_int32": np.int32(i),
        "np_float64": np.float64(i),
        "str": f"s{i}",
        "bytes": b"b",
        "none": None,
        "strings": np.array(["a", "bc"]),
        "byte_strings": np.array([b"ab", b"c"]),
        "objects": np.array([1, "x"], dtype=object),
        "empty": np.zeros((0, 3)),
        "strided": np.arange(40).reshape(4, 10)[:, ::2],
        "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        "big_strided": np.arange(40000.0).reshape(200, 200)[:, ::2],
        "big_fortran": np.asfortranarray(np.arange(20000.0).reshape(100, 200)),
        "nested": (np.arange(2) + i, [np.arange(2), 7]),
        "namedtuple": Pair(np.arange(3), np.arange(20000.0)),
        "dataclass": Boxed(np.arange(3)),
        "ordered": collections.OrderedDict(x=np.arange(2)),
        "structured": np.zeros(3, dtype=[("a", "i4"), ("b", "f8")]),
        "datetimes": np.array(["2020-01-01"], dtype="datetime64[ns]"),
    }


def batchable(i: int) -> dict:
    """A record grain batches into shared memory (its workers refuse empty, object and None leaves)."""
    r = record(i)
    for key in ("none", "objects", "empty", "namedtuple", "dataclass", "ordered", "big_strided", "big_fortran"):
        del r[key]
    return r


def numeric(i: int) -> dict:
    """A record ``jax.device_put`` takes."""
    return {"small": np.arange(3, dtype=np.float32) + i, "big": np.full((128, 128), i, np.float32), "int": i}


def _loader(lib, *, worker_count: int, batch: bool):
    class Make(lib.MapTransform):
        def map(self, i):
            return batchable(i) if batch else record(i)

    ops = [Make()] + ([lib.Batch(2)] if batch else [])
    sampler = lib.IndexSampler(N, lib.NoSharding(), shuffle=False, num_epochs=1)
    return lib.DataLoader(data_source=list(range(N)), sampler=sampler, operations=ops, worker_count=worker_count)


def _source(lib):
    return lib.MapDataset.source(list(range(N)))


def _workers(lib, n: int):
    return lib.MultiprocessingOptions(num_workers=n)


def _with_min_shm_size(lib, ds, size: int):
    return lib.experimental.WithOptionsIterDataset(ds, lib.experimental.DatasetOptions(min_shm_size=size))


def _device_put(lib, ds):
    import jax

    return lib.experimental.device_put(ds, jax.devices()[0])


CASES = {
    # The DataLoader: in process, one worker, two.
    "loader-w0": functools.partial(_loader, worker_count=0, batch=False),
    "loader-w0-batch": functools.partial(_loader, worker_count=0, batch=True),
    "loader-w1": functools.partial(_loader, worker_count=1, batch=False),
    "loader-w1-batch": functools.partial(_loader, worker_count=1, batch=True),
    "loader-w2-batch": functools.partial(_loader, worker_count=2, batch=True),
    # The Dataset API in process.
    "map": lambda lib: _source(lib).map(record).to_iter_dataset(),
    "map-batch": lambda lib: _source(lib).map(batchable).batch(2),
    "iter-batch": lambda lib: _source(lib).map(batchable).to_iter_dataset().batch(2),
    "read-threads": lambda lib: _source(lib).map(record).to_iter_dataset(lib.ReadOptions(num_threads=4)),
    "thread-prefetch": lambda lib: lib.experimental.ThreadPrefetchIterDataset(
        _source(lib).map(record).to_iter_dataset(), prefetch_buffer_size=2
    ),
    # mp_prefetch: what the workers hand over, and stages after it.
    "mp-prefetch-w1": lambda lib: _source(lib).map(record).to_iter_dataset().mp_prefetch(_workers(lib, 1)),
    "mp-prefetch-w2-batch": lambda lib: (
        _source(lib).map(batchable).to_iter_dataset().batch(2).mp_prefetch(_workers(lib, 2))
    ),
    "mp-prefetch-then-map": lambda lib: (
        _source(lib).map(numeric).to_iter_dataset().mp_prefetch(_workers(lib, 1)).map(
            lambda r: (r["small"], r["big"] + 1)
        )
    ),
    "mp-prefetch-scalars": lambda lib: _source(lib).to_iter_dataset().mp_prefetch(_workers(lib, 1)),
    # min_shm_size: smaller arrays are pickled, except, with several workers, those of a batch
    # stacked at the top of the workers' pipeline (into shared memory).
    "min-shm-size": lambda lib: _with_min_shm_size(lib, _source(lib).map(record).to_iter_dataset(), 100).mp_prefetch(
        _workers(lib, 1)
    ),
    "min-shm-size-batch": lambda lib: _with_min_shm_size(
        lib, _source(lib).map(batchable).to_iter_dataset().batch(2), 100
    ).mp_prefetch(_workers(lib, 1)),
    "min-shm-size-before-batch-w1": lambda lib: _with_min_shm_size(
        lib, _source(lib).map(batchable).to_iter_dataset(), 100
    ).batch(2).mp_prefetch(_workers(lib, 1)),
    "min-shm-size-before-batch-w2": lambda lib: _with_min_shm_size(
        lib, _source(lib).map(batchable).to_iter_dataset(), 100
    ).batch(2).mp_prefetch(_workers(lib, 2)),
    # device_put, in process and after workers.
    "device-put": lambda lib: _device_put(lib, _source(lib).map(numeric).to_iter_dataset().batch(2)),
    "device-put-after-workers": lambda lib: _device_put(
        lib, _source(lib).map(numeric).to_iter_dataset().batch(2).mp_prefetch(_workers(lib, 1))
    ),
}


def _observe(build, lib) -> list:
    """The leaf types of every element of the pipeline ``build(lib)`` makes."""
    ds = build(lib)
    it = iter(ds)
    try:
        return [leaf_types(element) for element in it]
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


@pytest.mark.parametrize("case", list(CASES))
def test_delivered_leaf_types_are_grains(grain_ref, case):
    build = CASES[case]
    theirs = _observe(build, grain_ref)
    ours = _observe(build, grainlike)
    assert len(ours) == len(theirs) > 0
    for k, (mine, reference) in enumerate(zip(ours, theirs)):
        assert mine == reference, f"element {k}: " + "; ".join(
            f"{a} != grain's {b}" for a, b in zip(mine, reference) if a != b
        )


def test_worker_cases_deliver_shared_memory_arrays(grain_ref):
    # The cases above are not vacuous: grain's workers deliver SharedMemoryArrays.
    del grain_ref
    types = {t[1] for element in _observe(CASES["mp-prefetch-w1"], grainlike) for t in element}
    assert "SharedMemoryArray" in types and "numpy.ndarray" in types
