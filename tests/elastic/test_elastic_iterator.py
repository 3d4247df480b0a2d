"""grainlike.experimental.ElasticIterator against grain 0.2.18's ElasticIterator."""

from __future__ import annotations

import numpy as np
import pytest

import grainlike as grain
import grainlike.experimental as experimental


@pytest.fixture
def grain_experimental(grain_ref):
    import grain.experimental as ref_experimental

    return ref_experimental


def _ds(lib):
    return lib.MapDataset.range(23).map(lambda x: x * 10)


def _run(it):
    """Every batch with the state after it, to the end."""
    out = []
    for batch in it:
        out.append((np.asarray(batch).tolist(), it.get_state()))
    return out


SHARDS = [(0, 1), (0, 2), (1, 2), (2, 3)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shard", SHARDS)
def test_same_batches_and_states_as_grain(grain_ref, grain_experimental, shard):
    ours = experimental.ElasticIterator(_ds(grain), 6, grain.ShardOptions(*shard))
    ref = grain_experimental.ElasticIterator(_ds(grain_ref), 6, grain_ref.ShardOptions(*shard))
    expected = _run(ref)
    assert len(expected) >= 3
    assert _run(ours) == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize("old, new", [((0, 2), (0, 1)), ((1, 2), (2, 3)), ((0, 1), (1, 2))])
def test_state_of_one_shard_count_restores_on_another_in_both_libraries(
    grain_ref, grain_experimental, old, new
):
    ours = experimental.ElasticIterator(_ds(grain), 6, grain.ShardOptions(*old))
    next(ours)
    state = ours.get_state()
    restored = {}
    for name, lib, module, saved in [
        ("grainlike", grain, experimental, state),
        ("grain", grain_ref, grain_experimental, state),
    ]:
        it = module.ElasticIterator(_ds(lib), 6, lib.ShardOptions(*new))
        it.set_state(saved)
        restored[name] = [np.asarray(b).tolist() for b in it]
    assert restored["grainlike"] == restored["grain"]
    # grain's state restores in grainlike too.
    ref = grain_experimental.ElasticIterator(_ds(grain_ref), 6, grain_ref.ShardOptions(*old))
    next(ref)
    it = experimental.ElasticIterator(_ds(grain), 6, grain.ShardOptions(*new))
    it.set_state(ref.get_state())
    assert [np.asarray(b).tolist() for b in it] == restored["grain"]


@pytest.mark.timeout(60)
def test_every_element_once_over_shards_after_a_shard_count_change(no_leaks):
    # Two shards run one step, then three shards go on from the state of either.
    first = [experimental.ElasticIterator(_ds(grain), 6, grain.ShardOptions(i, 2)) for i in range(2)]
    seen = [v for it in first for v in np.asarray(next(it)).tolist()]
    assert first[0].get_state() == first[1].get_state()
    for i in range(3):
        it = experimental.ElasticIterator(_ds(grain), 6, grain.ShardOptions(i, 3))
        it.set_state(first[i % 2].get_state())
        seen += [v for b in it for v in np.asarray(b).tolist()]
    # No element twice, none of the first three global batches missing (each
    # shard then stops at its own last whole batch, as in grain).
    assert len(seen) == len(set(seen)) == 22
    assert set(seen) >= {x * 10 for x in range(18)}


@pytest.mark.timeout(60)
def test_filter_is_refused_as_grain(grain_ref, grain_experimental):
    with pytest.raises(ValueError, match="does not support `filter`"):
        experimental.ElasticIterator(_ds(grain).filter(lambda x: x > 3), 4, grain.NoSharding())
    with pytest.raises(ValueError, match="does not support `filter`"):
        grain_experimental.ElasticIterator(_ds(grain_ref).filter(lambda x: x > 3), 4, grain_ref.NoSharding())


@pytest.mark.timeout(60)
def test_global_batch_not_divisible_by_shards_raises_at_first_next_as_grain(grain_ref, grain_experimental):
    ours = experimental.ElasticIterator(_ds(grain), 5, grain.ShardOptions(0, 2))
    ref = grain_experimental.ElasticIterator(_ds(grain_ref), 5, grain_ref.ShardOptions(0, 2))
    for it in (ours, ref):
        with pytest.raises(ValueError, match="not divisible by shard count 2"):
            next(it)


@pytest.mark.timeout(60)
def test_with_workers_same_batches_as_without(no_leaks):
    plain = experimental.ElasticIterator(_ds(grain), 4, grain.ShardOptions(1, 2))
    expected = [np.asarray(b).tolist() for b in plain]
    it = experimental.ElasticIterator(
        _ds(grain),
        4,
        grain.ShardOptions(1, 2),
        multiprocessing_options=grain.MultiprocessingOptions(num_workers=2),
    )
    try:
        head = np.asarray(next(it)).tolist()
        state = it.get_state()
        it.set_state(state)
        rest = [np.asarray(b).tolist() for b in it]
    finally:
        it.close()
    assert [head, *rest] == expected
