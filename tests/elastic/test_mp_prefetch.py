"""mp_prefetch states restore on another number of workers when no element needs skipping."""

from __future__ import annotations

import collections
import contextlib

import numpy as np
import pytest

import grainlike as grain
from grainlike.experimental import WindowShuffleIterDataset


def _ds(workers: int, **kw):
    ds = grain.MapDataset.range(24).to_iter_dataset().map(lambda x: x + 1000).batch(3, **kw)
    return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))


def _values(batches) -> list:
    return [int(v) for b in batches for v in np.asarray(b).reshape(-1)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("old, new, steps", [(2, 3, 2), (3, 1, 3), (1, 2, 3), (2, 1, 4)])
def test_state_after_a_whole_round_restores_on_another_worker_count(no_leaks, old, new, steps):
    with contextlib.closing(_ds(old).__iter__()) as it:
        before = _values(next(it) for _ in range(steps))
        state = it.get_state()
    with contextlib.closing(_ds(new).__iter__()) as it:
        it.set_state(state)
        after = _values(it)
    got = collections.Counter(before + after)
    assert got == collections.Counter(range(1000, 1024))


@pytest.mark.timeout(60)
def test_state_mid_round_is_refused_naming_the_elements(no_leaks):
    with contextlib.closing(_ds(2).__iter__()) as it:
        first = _values([next(it)])
        state = it.get_state()
    with contextlib.closing(_ds(3).__iter__()) as it:
        with pytest.raises(grain.InvalidStateError, match=r"element 1 was not consumed but 2 after it were \(\[2, 4\]\)"):
            it.set_state(state)
        # Left where it was.
        assert _values([next(it)]) == [1000, 1003, 1006]
    assert first == [1000, 1002, 1004]


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
