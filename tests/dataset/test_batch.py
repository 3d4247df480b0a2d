"""Batching: make_batch (the default batch_fn), BatchFn specs, shared-memory output, errors."""

from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np
import pytest

import grainlike as grain
from grainlike.core.shared_memory_array import SharedMemoryArray
from grainlike.dataset.transformations.batch import BatchFn, BatchIterDataset, make_batch
from grainlike.dataset.nodes.element_spec import ShapeDtypeStruct, get_element_spec
from grainlike.core import tree_lib


@pytest.fixture(scope="module")
def grain_batch():
    import absl.flags

    absl.flags.FLAGS.mark_as_parsed()
    from grain._src.python.dataset.transformations import batch

    return batch


VALUES = [
    [np.arange(3), np.arange(3) + 3],
    [{"a": 1, "b": (b"x", 2.5)}, {"a": 2, "b": (b"yy", 3.5)}],
    [{"s": "short"}, {"s": "a much longer string"}],
    [np.float32(1)],
]


@pytest.mark.parametrize("values", VALUES, ids=range(len(VALUES)))
def test_make_batch_equals_grains(grain_batch, values):
    ours, theirs = make_batch(values), grain_batch.make_batch(values)
    np.testing.assert_equal(ours, theirs)
    assert tree_lib.map_structure(lambda x: (x.dtype, x.shape), ours) == tree_lib.map_structure(
        lambda x: (x.dtype, x.shape), theirs
    )


def test_make_batch_errors_start_with_grains_text():
    with pytest.raises(ValueError, match="Cannot batch 0 values"):
        make_batch([])
    with pytest.raises(ValueError) as info:
        make_batch([{"a": np.zeros(3)}, {"a": np.zeros(2)}])
    message = str(info.value)
    assert message.startswith("Expected all input elements to have the same structure but got:\n")
    assert "element 1: {'a': 'float64[2]'}" in message and "cannot stack the elements at ['a']" in message


def test_make_batch_to_shared_memory_keeps_strings_and_objects():
    values = [{"x": np.arange(4, dtype=np.int32), "s": "ab", "o": np.array([None]), "n": 1},
              {"x": np.arange(4, dtype=np.int32) + 4, "s": "a longer one", "o": np.array([1]), "n": 2}]
    out = make_batch(values, output_to_shared_memory=True)
    try:
        assert type(out["x"]) is SharedMemoryArray and out["x"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
        # Strings are stacked at their widest (never truncated to the first one's width).
        assert type(out["s"]) is SharedMemoryArray and out["s"].tolist() == ["ab", "a longer one"]
        assert type(out["n"]) is SharedMemoryArray and out["n"].tolist() == [1, 2]
        # Objects are pointers into this process: they stay a plain array.
        assert type(out["o"]) is np.ndarray and out["o"].dtype == object
        mapped = SharedMemoryArray.from_metadata(out["x"].metadata)
        assert mapped.tolist() == out["x"].tolist()
    finally:
        for name in ("x", "s", "n"):
            out[name].unlink_on_del()


def test_batch_fn_make_batch_is_the_default_batching():
    ds = grain.MapDataset.range(7).map(lambda i: {"v": np.full(2, i)})
    default = list(ds.batch(3))
    explicit = ds.batch(3, batch_fn=make_batch)
    np.testing.assert_equal(list(explicit), default)
    # The default keeps element spec inference (grain: ``_batch_fn is make_batch``).
    spec = get_element_spec(grain.MapDataset.range(7).batch(3, batch_fn=make_batch, drop_remainder=True))
    assert spec == ShapeDtypeStruct(shape=(3,), dtype=np.int64)


class _DictBatch(BatchFn):
    def __call__(self, elements: Sequence[Any]) -> dict:
        return {"batch": make_batch(elements)}

    def output_spec(self, input_spec: Any, batch_size: int, drop_remainder: bool) -> Any:
        size = batch_size if drop_remainder else None
        # Specs are leaves of grain's tree functions: output_spec code maps over them.
        return {"batch": tree_lib.map_structure(lambda s: ShapeDtypeStruct((size,) + s.shape, s.dtype), input_spec)}


def test_a_batch_fn_with_output_spec_describes_its_batches():
    ds = grain.MapDataset.range(10).batch(4, batch_fn=_DictBatch())
    assert get_element_spec(ds) == {"batch": ShapeDtypeStruct(shape=(None,), dtype=np.int64)}
    assert ds[2]["batch"].tolist() == [8, 9]


def test_enable_shared_memory_output_makes_shared_memory_batches():
    ds = BatchIterDataset(grain.MapDataset.range(5).to_iter_dataset(), batch_size=2)
    ds.enable_shared_memory_output()
    batches = list(ds)
    assert [b.tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    for b in batches:
        assert type(b) is SharedMemoryArray
        b.unlink_on_del()
    # A custom batch_fn without the method is left as it is.
    ds = BatchIterDataset(grain.MapDataset.range(2).to_iter_dataset(), 2, batch_fn=functools.partial(make_batch))
    ds.enable_shared_memory_output()
    assert type(next(iter(ds))) is np.ndarray


def test_map_dataset_batch_after_filter_names_grains_reason_and_the_stage():
    ds = grain.MapDataset.range(10).filter(lambda x: x % 2 == 0)
    with pytest.raises(ValueError, match="`MapDataset.batch` can not follow `MapDataset.filter` because") as info:
        ds.batch(3)
    assert "The stage: FilterMapDataset(transform=<lambda>" in str(info.value)
