"""Batch stacking of nested structures."""

import collections

import numpy as np
import pytest

from grainlike.core import tree


def test_stacks_nested_dicts_tuples_lists_and_scalars():
    Pair = collections.namedtuple("Pair", "a b")
    values = [
        {"img": np.full((2, 2), i, np.uint8), "meta": (i, float(i)), "l": [np.int32(i)], "p": Pair(i, b"x")}
        for i in range(3)
    ]
    out = tree.stack(values)
    assert out["img"].shape == (3, 2, 2) and out["img"].dtype == np.uint8
    assert out["img"][:, 0, 0].tolist() == [0, 1, 2]
    assert isinstance(out["meta"], tuple) and out["meta"][0].tolist() == [0, 1, 2]
    assert out["meta"][1].dtype == np.float64
    assert isinstance(out["l"], list) and out["l"][0].dtype == np.int32
    assert isinstance(out["p"], Pair) and out["p"].b.tolist() == [b"x"] * 3


def test_single_element_gets_leading_axis():
    out = tree.stack([{"x": np.arange(3)}])
    assert out["x"].shape == (1, 3)


def test_allocator_receives_each_array_leaf():
    calls = []

    def alloc(shape, dtype):
        calls.append((shape, dtype))
        return np.empty(shape, dtype)

    out = tree.stack([{"a": np.ones(4, np.float32), "b": np.zeros(2)} for _ in range(5)], alloc)
    assert sorted(calls, key=str) == sorted([((5, 4), np.dtype(np.float32)), ((5, 2), np.dtype(np.float64))], key=str)
    assert out["a"].sum() == 20


@pytest.mark.parametrize(
    "values, fragment",
    [
        ([{"a": 1}, {"b": 1}], "dict keys differ"),
        ([(1, 2), (1,)], "tuple of length 2"),
        ([np.zeros(3), np.zeros(4)], "same shape"),
        ([{"a": np.zeros(2)}, {"a": np.zeros((2, 2))}], "['a']"),
    ],
)
def test_mismatched_elements_name_the_place_and_show_every_structure(values, fragment):
    with pytest.raises(ValueError) as info:
        tree.stack(values)
    msg = str(info.value)
    assert fragment in msg
    assert "element 0" in msg and "element 1" in msg


def test_empty_list_is_refused():
    with pytest.raises(ValueError, match="empty"):
        tree.stack([])
