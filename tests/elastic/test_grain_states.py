"""States written by grain 0.2.18's DataLoader restore elastically in grainlike, and back."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

import grainlike as grain
from grainlike.loader.legacy_state import SKIP_KEY

N = 24


def _loader(lib, workers: int):
    return lib.DataLoader(
        data_source=lib.RangeDataSource(0, N, 1),
        sampler=lib.IndexSampler(N, lib.NoSharding(), shuffle=True, num_epochs=1, seed=11),
        operations=[lib.Batch(3)],
        worker_count=workers,
    )


def _records(batches) -> list:
    return [int(v) for b in batches for v in np.asarray(b).reshape(-1)]


@pytest.fixture(scope="module")
def grain_run(grain_ref):
    """grain with 2 workers: the records and state after 1 and 3 batches."""
    out = {}
    it = iter(_loader(grain_ref, 2))
    delivered = []
    for step in range(4):
        if step in (1, 3):
            out[step] = (list(delivered), it.get_state())
        delivered += _records([next(it)])
    del it  # grain stops its workers when the iterator is collected
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("new", [0, 3])
def test_grain_state_of_two_workers_restores_on_another_count(grain_run, no_leaks, new):
    for step, (before, state) in grain_run.items():
        with iter(_loader(grain, new)) as it:
            it.set_state(state)
            after = _records(it)
        assert collections.Counter(before + after) == collections.Counter(range(N)), step


@pytest.mark.timeout(120)
def test_grainlike_state_after_the_skips_restores_in_grain(grain_ref, grain_run, no_leaks):
    before, state = grain_run[1]  # worker 0 delivered positions 0, 2, 4
    with iter(_loader(grain, 0)) as it:
        it.set_state(state)
        assert json.loads(it.get_state())[SKIP_KEY] == {"step": 1, "ranges": [[2, 3], [4, 5]]}
        middle = []
        while SKIP_KEY in json.loads(it.get_state()):
            middle += _records([next(it)])
        state = it.get_state()
        rest = _records(it)
    # The state is grain's again: grain restores it and goes on with the same records.
    ref = iter(_loader(grain_ref, 0))
    ref.set_state(state)
    assert _records(ref) == rest
    assert collections.Counter(before + middle + rest) == collections.Counter(range(N))
