"""``RngPool`` against grain 0.2.18: the same draws for each (seed, index, op_seed)."""

import pickle
import threading

import pytest

from grainlike.experimental import RngPool


def _draws(pool, index, op_seed):
    rng = pool.acquire_rng(index, op_seed=op_seed)
    out = (rng.integers(0, 1 << 62, size=3).tolist(), rng.random(2).tolist(), int(rng.integers(2**31)))
    pool.release_rng(rng)
    return out


@pytest.mark.parametrize("seed", [0, 7, 2**32 - 1, 123456789012])
def test_draws_match_reference_for_each_index_and_op_seed(grain_ref, seed):
    ours, theirs = RngPool(seed), grain_ref.experimental.RngPool(seed)
    # Released generators are reused: a later index must not see an earlier draw.
    for index, op_seed in [(0, 0), (1, 0), (0, 0), (5, 3), (2**40, 1), (1, 0)]:
        assert _draws(ours, index, op_seed) == _draws(theirs, index, op_seed)


def test_a_reused_generator_starts_its_stream_afresh():
    pool = RngPool(3)
    first = _draws(pool, 9, 0)
    rng = pool.acquire_rng(4)
    rng.random(5)  # Leave a partly used buffer behind.
    rng.integers(2**31)
    pool.release_rng(rng)
    assert _draws(pool, 9, 0) == first


def test_a_pickled_pool_draws_the_same(grain_ref):
    pool = RngPool(11)
    pool.release_rng(pool.acquire_rng(1))
    copy = pickle.loads(pickle.dumps(pool))
    assert _draws(copy, 4, 2) == _draws(pool, 4, 2) == _draws(grain_ref.experimental.RngPool(11), 4, 2)


def test_threads_sharing_a_pool_draw_their_own_streams():
    pool = RngPool(5)
    expected = {i: _draws(RngPool(5), i, 0) for i in range(40)}
    got = {}

    def work(start):
        for i in range(start, 40, 4):
            got[i] = _draws(pool, i, 0)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert got == expected


def test_a_negative_seed_raises_value_error_as_reference(grain_ref):
    for cls in (RngPool, grain_ref.experimental.RngPool):
        with pytest.raises(ValueError):
            cls(-1).acquire_rng(0)
