"""index_shuffle against grain 0.2.18's own (C++) index_shuffle on random draws."""

import collections
import functools
import random

import numpy as np
import pytest

from grainlike.core.index_shuffle import index_shuffle

# Rounds around the points where std::seed_seq changes its mixing span (n = 7, 39,
# 68, 623), plus the limits.
ROUNDS = [4, 6, 8, 38, 40, 66, 68, 100, 622, 624, 1024]


@pytest.fixture(scope="module")
def ref_shuffle(grain_ref):
    """The reference's low-level ``index_shuffle(index, max_index, seed, rounds)``.

    Memoised: the scalar and array tests ask it for the same draws, and each
    call on a small range costs the reference tens of milliseconds.
    """
    from grain._src.python.experimental.index_shuffle.python import index_shuffle_module

    return functools.lru_cache(maxsize=None)(index_shuffle_module.index_shuffle)


def _random_max_index(rng):
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randrange(0, 300)
    if kind == 1:
        return rng.randrange(0, 2**20)
    if kind == 2:
        return rng.randrange(0, 2**63)
    if kind == 3:
        return rng.randrange(0, 2**rng.randrange(1, 64))
    # Around powers of two, where the block width and the double-precision log2
    # (which rounds 2**B + small to exactly B for large B) decide the result.
    b = rng.randrange(1, 63)
    near = 2**b + rng.randrange(-3, 4) + (rng.randrange(0, 2 ** max(0, b - 52)) if kind == 5 else 0)
    return min(max(near, 0), 2**63 - 1)


def _draws(n, seed):
    rng = random.Random(seed)
    draws = []
    for _ in range(n):
        max_index = _random_max_index(rng)
        index = rng.choice([0, max_index, rng.randrange(0, max_index + 1)])
        seed_ = rng.choice([0, 1, 2**32 - 1, rng.randrange(2**32)])
        if max_index < 2000:
            # Few seeds on small ranges: each (range, seed) costs the reference tens
            # of milliseconds (a ~2**16 / max_index step walk) and this side a table.
            seed_ = rng.choice([0, 1, 2**32 - 1, 2_654_435_761])
        # Mostly the rounds samplers use; the rest spread over the whole range, but
        # not on small ranges: the reference regenerates its round keys for every
        # encryption of the cycle-walk, which takes it seconds per call there.
        rounds = rng.choice([4, 4, 4, 8])
        if max_index > 2000 and rng.random() < 0.2:
            rounds = rng.choice(ROUNDS)
        draws.append((index, max_index, seed_, rounds))
    return draws


DRAWS = _draws(3000, seed=20240)


def test_scalar_matches_reference_on_random_draws(ref_shuffle):
    pairs = [(d, index_shuffle(*d), ref_shuffle(*d)) for d in DRAWS]
    mismatches = [(d, got, expected) for d, got, expected in pairs if got != expected]
    assert not mismatches, mismatches[:5]


def test_array_matches_reference_on_random_draws(ref_shuffle):
    rng = random.Random(7)
    groups = collections.defaultdict(list)
    for index, max_index, seed, rounds in DRAWS:
        groups[max_index, seed, rounds].append(index)
    for (max_index, seed, rounds), indices in groups.items():
        if max_index > 2000:
            indices = indices + [rng.randrange(0, max_index + 1) for _ in range(5)]
        got = index_shuffle(np.array(indices, np.int64), max_index, seed, rounds)
        expected = [ref_shuffle(i, max_index, seed, rounds) for i in indices]
        assert got.tolist() == expected, (max_index, seed, rounds)


@pytest.mark.parametrize("max_index", [9, 1000, 65536, 100_000, 2**20, 2**31 - 1, 2**52 + 1, 2**63 - 1])
@pytest.mark.parametrize("rounds", [4, 8])
def test_array_of_consecutive_indices_matches_reference(ref_shuffle, max_index, rounds):
    indices = np.array(range(max(0, max_index - 499), max_index + 1), np.int64)
    got = index_shuffle(indices, max_index, 52, rounds)
    assert got.tolist() == [ref_shuffle(int(i), max_index, 52, rounds) for i in indices]


@pytest.mark.parametrize(
    "args",
    [(-1, 8, 0, 4), (9, 8, 0, 4), (0, -1, 0, 4), (0, 8, 0, 2), (0, 8, 0, 5), (0, 8, 0, 1026)],
)
def test_rejects_what_the_reference_rejects_with_value_error(ref_shuffle, args):
    with pytest.raises(ValueError):
        ref_shuffle(*args)
    with pytest.raises(ValueError):
        index_shuffle(*args)


@pytest.mark.parametrize("args", [(0, 8, -1, 4), (0, 8, 2**32, 4), (0, 8, 0, -4), (0, 2**63, 0, 4)])
def test_out_of_range_seed_rounds_or_max_index_raise_value_error_where_reference_raises_type_error(
    ref_shuffle, args
):
    # The reference's pybind11 binding rejects values that do not fit its C++
    # parameter types (uint32 seed and rounds, int64 max_index) as TypeError; here
    # they are range errors.
    with pytest.raises(TypeError):
        ref_shuffle(*args)
    with pytest.raises(ValueError):
        index_shuffle(*args)
