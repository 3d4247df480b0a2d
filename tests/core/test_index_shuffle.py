"""index_shuffle against grain's reference vectors in tests/data, and its own properties."""

import collections
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grainlike.core import index_shuffle as isf
from grainlike.core.index_shuffle import index_shuffle

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
with open(os.path.join(DATA, "index_shuffle_vectors.json")) as _f:
    ROWS = [tuple(r) for r in json.load(_f)["rows"]]  # (index, max_index, seed, rounds, result)

GROUPS = collections.defaultdict(list)
for _row in ROWS:
    GROUPS[_row[1:4]].append(_row)


def _is_quirk(max_index):
    """max_index == 2**B for an even B >= 16: the reference is not a bijection there."""
    b = max_index.bit_length() - 1
    return max_index == 1 << b and b >= 16 and b % 2 == 0


def test_vectors_cover_the_interesting_cases():
    max_indices = {r[1] for r in ROWS}
    assert {1, 65535, 65536, 65537, 2**20} <= max_indices
    assert max(max_indices) > 2**32
    assert {r[3] for r in ROWS} >= {4, 8}


@pytest.mark.parametrize("row", ROWS, ids=lambda r: "i{}-m{}-s{}-r{}".format(*r[:4]))
def test_scalar_matches_reference_vector(row):
    index, max_index, seed, rounds, expected = row
    got = index_shuffle(index, max_index, seed, rounds)
    assert type(got) is int
    assert got == expected


@pytest.mark.parametrize("group", sorted(GROUPS), ids=lambda g: "m{}-s{}-r{}".format(*g))
def test_array_matches_reference_vectors_in_one_call(group):
    max_index, seed, rounds = group
    rows = GROUPS[group]
    indices = np.array([r[0] for r in rows])
    # Repeated past the size below which arrays take the scalar path.
    reps = -(-64 // len(indices))
    got = index_shuffle(np.tile(indices, reps), max_index, seed, rounds)
    assert got.dtype == np.int64
    assert got.reshape(reps, -1).tolist() == [[r[4] for r in rows]] * reps


@pytest.mark.parametrize(
    "max_index", [1, 2, 7, 9, 100, 1000, 65535, 65537, 100_000, 2**18 - 1, 2**18 + 1]
)
@pytest.mark.parametrize("seed", [0, 1, 42, 2**32 - 1])
def test_outputs_over_the_whole_range_are_a_permutation(max_index, seed):
    out = index_shuffle(np.arange(max_index + 1), max_index, seed)
    assert np.array_equal(np.sort(out), np.arange(max_index + 1))


@pytest.mark.parametrize("max_index", [9, 1000, 70_000])
def test_permutation_with_more_rounds_is_a_permutation_and_differs(max_index):
    four = index_shuffle(np.arange(max_index + 1), max_index, 3, rounds=4)
    many = index_shuffle(np.arange(max_index + 1), max_index, 3, rounds=32)
    assert np.array_equal(np.sort(many), np.arange(max_index + 1))
    assert not np.array_equal(four, many)


def test_scalar_permutation_over_a_small_range():
    assert sorted(index_shuffle(i, 9, 42) for i in range(10)) == list(range(10))


@pytest.mark.parametrize("max_index", [2**16, 2**18, 2**20])
def test_quirk_at_exact_power_of_four_maps_max_index_like_zero(max_index):
    # The block is B bits wide, so max_index == 2**B loses its top bit and
    # encrypts exactly as 0 does; the rest of the range is still a permutation of
    # [0, max_index) (max_index itself is never produced).
    assert _is_quirk(max_index)
    out = index_shuffle(np.arange(max_index + 1), max_index, 5)
    assert out[-1] == out[0]
    assert np.array_equal(np.sort(out[:-1]), np.arange(max_index))
    assert index_shuffle(max_index, max_index, 5) == index_shuffle(0, max_index, 5)


def test_different_seeds_give_different_permutations():
    a = index_shuffle(np.arange(1000), 999, 1)
    b = index_shuffle(np.arange(1000), 999, 2)
    assert not np.array_equal(a, b)


def test_max_index_zero_maps_to_zero():
    assert index_shuffle(0, 0, 123) == 0
    assert index_shuffle(np.zeros((2, 3), np.int64), 0, 123).tolist() == [[0] * 3] * 2


def test_array_keeps_shape_and_returns_int64():
    idx = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    for max_index in (99, 10**6, 2**40):
        out = index_shuffle(idx, max_index, 9)
        assert out.shape == (2, 3, 4)
        assert out.dtype == np.int64
        assert out.ravel().tolist() == [index_shuffle(int(i), max_index, 9) for i in idx.ravel()]


def test_empty_array_gives_empty_int64_array():
    for max_index in (5, 10**9):
        out = index_shuffle(np.array([], np.int64), max_index, 1)
        assert out.shape == (0,) and out.dtype == np.int64


def test_array_input_is_not_modified():
    idx = np.arange(50, dtype=np.uint64)
    index_shuffle(idx, 10**7, 4)
    assert idx.tolist() == list(range(50))


def test_numpy_integer_scalars_give_python_int():
    got = index_shuffle(np.int64(3), np.int64(99), np.uint32(7), np.int32(4))
    assert type(got) is int
    assert got == index_shuffle(3, 99, 7, 4)


def test_largest_max_index_works_on_both_paths():
    max_index = 2**63 - 1
    idx = np.array([0, 1, 2**62, max_index], np.int64)
    out = index_shuffle(idx, max_index, 11)
    assert out.tolist() == [index_shuffle(int(i), max_index, 11) for i in idx]
    assert all(0 <= v <= max_index for v in out.tolist())


@settings(max_examples=200, deadline=None)
@given(
    max_index=st.one_of(
        st.integers(0, 300),
        st.integers(0, 2**17),
        st.integers(0, 2**63 - 1),
        st.integers(0, 62).map(lambda b: 2**b),
    ),
    seed=st.integers(0, 2**32 - 1),
    rounds=st.sampled_from([4, 6, 8, 20]),
    data=st.data(),
)
def test_array_and_scalar_paths_agree(max_index, seed, rounds, data):
    indices = data.draw(st.lists(st.integers(0, max_index), min_size=1, max_size=20))
    expected = [index_shuffle(i, max_index, seed, rounds) for i in indices]
    assert all(0 <= v <= max_index for v in expected)
    small = index_shuffle(np.array(indices, np.int64), max_index, seed, rounds)
    assert small.tolist() == expected
    # Large enough for the vectorised path.
    large = index_shuffle(np.array(indices * 40, np.int64), max_index, seed, rounds)
    assert large.tolist() == expected * 40


@pytest.mark.parametrize("max_index", [1, 9, 300, 20_000, 65_535, 65_536])
@pytest.mark.parametrize("rounds", [4, 10])
def test_table_and_walk_strategies_agree(max_index, rounds):
    # Small ranges are walked one index at a time until enough work has been spent,
    # then tabulated; both must give the same permutation.
    seed = 1234 + max_index
    isf._PLANS.clear()
    plan = isf._get_plan(max_index, seed, rounds)
    if plan.table is None:
        walked = [isf._walk_scalar(i, plan) for i in range(max_index + 1)]
    else:  # max_index == 0 has a trivial table from the start
        walked = [0]
    table = plan.build_table().tolist() if max_index else [0]
    assert walked == table
    isf._PLANS.clear()
    assert index_shuffle(np.arange(max_index + 1), max_index, seed, rounds).tolist() == table


@pytest.mark.parametrize(
    "args, match",
    [
        ((-1, 8, 0, 4), r"^index must be in \[0, max_index\], got -1 \(max_index=8\)$"),
        ((9, 8, 0, 4), r"^index must be in \[0, max_index\], got 9 \(max_index=8\)$"),
        ((0, -1, 0, 4), r"max_index must be an int in \[0, 2\*\*63\), got -1"),
        ((0, 2**63, 0, 4), r"max_index must be an int in \[0, 2\*\*63\), got 9223372036854775808"),
        ((0, 8, -1, 4), r"seed must be an int in \[0, 2\*\*32\), got -1"),
        ((0, 8, 2**32, 4), r"seed must be an int in \[0, 2\*\*32\), got 4294967296"),
        ((0, 8, 0, 2), r"^rounds must be an even integer between 4 and 1024, got 2$"),
        ((0, 8, 0, 5), r"^rounds must be an even integer between 4 and 1024, got 5$"),
        ((0, 8, 0, 1026), r"^rounds must be an even integer between 4 and 1024, got 1026$"),
        ((0, 8, 0, -4), r"^rounds must be an even integer between 4 and 1024, got -4$"),
    ],
)
def test_invalid_arguments_raise_value_error_naming_the_value(args, match):
    with pytest.raises(ValueError, match=match):
        index_shuffle(*args)


@pytest.mark.parametrize("max_index", [8, 10**6])
def test_out_of_range_array_element_raises_value_error(max_index):
    with pytest.raises(ValueError, match=rf"got {max_index + 1}"):
        index_shuffle(np.array([0, max_index + 1]), max_index, 0)
    with pytest.raises(ValueError, match=r"got -3"):
        index_shuffle(np.array([[0], [-3]]), max_index, 0)


def test_invalid_arguments_raise_even_after_valid_calls_with_same_parameters():
    # Valid parameters are cached; the cache must not bypass checks on index.
    index_shuffle(1, 8, 0)
    with pytest.raises(ValueError):
        index_shuffle(9, 8, 0)
    with pytest.raises(TypeError):
        index_shuffle(1, 8.0, 0)


@pytest.mark.parametrize(
    "args",
    [(0.0, 8, 0, 4), (0, 8.0, 0, 4), (0, 8, 0.5, 4), (0, 8, 0, 4.0), ("1", 8, 0, 4), ([1], 8, 0, 4)],
)
def test_non_integer_arguments_raise_type_error(args):
    with pytest.raises(TypeError, match="must be an int"):
        index_shuffle(*args)


def test_float_array_raises_type_error():
    with pytest.raises(TypeError, match="float64"):
        index_shuffle(np.array([0.0, 1.0]), 8, 0)


def test_vectorised_call_on_100k_indices_is_fast():
    import time

    idx = np.arange(100_000)
    index_shuffle(idx, 99_999, 3)  # round keys cached
    start = time.process_time()
    index_shuffle(idx, 99_999, 3)
    # Generous bound (a loaded CI machine); a per-element loop takes seconds.
    assert time.process_time() - start < 0.5


def test_small_range_table_is_built_at_most_once(monkeypatch):
    builds = []
    real = isf._permutation_table
    monkeypatch.setattr(isf, "_permutation_table", lambda *a: builds.append(a) or real(*a))
    isf._PLANS.clear()
    plan = isf._get_plan(19_999, 77, 4)
    plan.budget = 1  # the next walk spends it, as an element-wise array walk may
    walked = [isf._walk_scalar(i, plan) for i in range(100)]
    out = index_shuffle(np.arange(20_000), 19_999, 77)
    for i in range(100):
        index_shuffle(i, 19_999, 77)
    assert len(builds) == 1
    assert out[:100].tolist() == walked
    assert np.array_equal(np.sort(out), np.arange(20_000))
