"""A record's rng: built lazily and fast, drawing exactly what ``Philox(key=k)`` draws."""

import numpy as np
import pytest

from grainlike.core.record import LazyRng, RecordMetadata, philox_generator


def _plain(state):
    if isinstance(state, dict):
        return {k: _plain(v) for k, v in state.items()}
    return state.tolist() if isinstance(state, np.ndarray) else state


@pytest.mark.parametrize("key", [0, 1, 12345, 2**32 + 7, 2**63 + 5, 2**64 - 1, 2**64 + 3, 2**128 - 1])
def test_philox_generator_draws_what_numpy_philox_draws(key):
    ours = philox_generator(key)
    reference = np.random.Generator(np.random.Philox(key=key))
    assert _plain(ours.bit_generator.state) == _plain(reference.bit_generator.state)
    assert ours.integers(0, 2**62, 7).tolist() == reference.integers(0, 2**62, 7).tolist()
    assert ours.random(5).tolist() == reference.random(5).tolist()
    # 32-bit draws use the half-word buffer, which must start empty in both.
    assert ours.integers(0, 2**31, 3, dtype=np.int32).tolist() == reference.integers(0, 2**31, 3, dtype=np.int32).tolist()
    assert ours.normal(size=3).tolist() == reference.normal(size=3).tolist()


def test_generators_are_independent_of_each_other():
    a, b = philox_generator(9), philox_generator(9)
    first = a.random(4).tolist()
    assert b.random(4).tolist() == first  # a's draws did not move b


@pytest.mark.parametrize("key", [-1, 2**128])
def test_keys_numpy_refuses_are_refused_the_same_way(key):
    with pytest.raises(ValueError):
        np.random.Philox(key=key)
    with pytest.raises(ValueError):
        philox_generator(key)


def test_metadata_rng_is_built_on_first_use_and_kept():
    meta = RecordMetadata(index=4, record_key=2, rng=LazyRng(10 + 4))
    rng = meta.rng
    assert meta.rng is rng
    assert rng.random() == np.random.Generator(np.random.Philox(key=14)).random()


def test_spawning_from_a_record_rng_works_and_is_deterministic():
    children_a = philox_generator(3).spawn(2)
    children_b = philox_generator(3).spawn(2)
    assert [c.random() for c in children_a] == [c.random() for c in children_b]
