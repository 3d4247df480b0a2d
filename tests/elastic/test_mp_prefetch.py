"""mp_prefetch states restore on another number of workers: every element once."""

from __future__ import annotations

import collections
import contextlib

import numpy as np
import pytest

import grainlike as grain
from grainlike.experimental import WindowShuffleIterDataset

ELEMENTS = collections.Counter(v for v in range(1000, 1024) if v % 5)


def _ds(workers: int):
    ds = grain.MapDataset.range(24).to_iter_dataset().map(lambda x: x + 1000)
    ds = ds.filter(lambda x: x % 5 != 0).batch(3)
    return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))


def _values(batches) -> list:
    return [int(v) for b in batches for v in np.asarray(b).reshape(-1)]


def _assert_every_element_once(ds, old: int, new: int, steps: int) -> None:
    """``steps`` batches on ``old`` workers, the rest after restoring on ``new``: each element once."""
    with contextlib.closing(ds(old).__iter__()) as it:
        before = _values(next(it) for _ in range(steps))
        state = it.get_state()
    with contextlib.closing(ds(new).__iter__()) as it:
        it.set_state(state)
        after = _values(it)
    assert collections.Counter(before + after) == ELEMENTS


@pytest.mark.timeout(60)
@pytest.mark.parametrize("old, new, steps", [(2, 3, 1), (3, 1, 2), (1, 2, 3), (3, 2, 4), (2, 1, 3)])
def test_state_restores_on_another_worker_count_every_element_once(no_leaks, old, new, steps):
    _assert_every_element_once(_ds, old, new, steps)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("old, new, steps", [(2, 3, 1), (3, 2, 2), (3, 1, 1)])
def test_restore_on_another_worker_count_skips_positions_a_map_filter_left_empty(no_leaks, old, new, steps):
    # The filter runs before to_iter_dataset(): a skipped position may hold None,
    # which the reading stage skips without taking the element after it.
    def ds(workers):
        ds = grain.MapDataset.range(24).map(lambda x: x + 1000).filter(lambda x: x % 5 != 0)
        return ds.to_iter_dataset().batch(3).mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))

    _assert_every_element_once(ds, old, new, steps)


@pytest.mark.timeout(60)
def test_pending_skips_are_in_the_state_until_passed(no_leaks):
    with contextlib.closing(_ds(2).__iter__()) as it:
        before = _values([next(it)])  # worker 0: elements 0, 2, 4, 6 (1000 dropped)
        state = it.get_state()
    with contextlib.closing(_ds(3).__iter__()) as it:
        it.set_state(state)
        restored = it.get_state()
        # Element 1 is the first not consumed; 2, 4, 6 are skipped by new workers 2, 1, 0.
        assert [s.get("skip_positions") for s in restored["iterators_in_use_states"]] == [[2], [1], [0]]
        middle = _values([next(it)])
        pending = it.get_state()
    with contextlib.closing(_ds(1).__iter__()) as it:
        it.set_state(pending)
        after = _values(it)
        assert "skip_positions" not in it.get_state()["iterators_in_use_states"][0]
    assert collections.Counter(before + middle + after) == ELEMENTS


@pytest.mark.timeout(60)
def test_pipeline_whose_state_is_not_a_position_is_refused(no_leaks):
    def ds(workers):
        inner = WindowShuffleIterDataset(grain.MapDataset.range(12).to_iter_dataset(), window_size=4, seed=1)
        return inner.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))

    with contextlib.closing(ds(2).__iter__()) as it:
        next(it)
        next(it)
        state = it.get_state()
    with contextlib.closing(ds(3).__iter__()) as it:
        with pytest.raises(grain.InvalidStateError, match="not the position of a to_iter_dataset"):
            it.set_state(state)
        assert next(it) is not None  # left usable
