"""Sources and maps that wait, with default options: grainlike reads them in threads, as grain does.

The records, their order and every state equal grain's, with 0 and 2 workers,
in the DataLoader and in the Dataset API.
"""

from __future__ import annotations

import pytest

import grainlike
from tests.helpers import waiting
from tests.helpers.pipelines import as_plain

pytestmark = pytest.mark.timeout(180)

N = 96


def _run(it) -> tuple[list, list]:
    outputs, states = [], []
    for x in it:
        outputs.append(x)
        states.append(it.get_state())
    return outputs, states


@pytest.mark.parametrize("workers", [0, 2])
def test_data_loader_over_a_waiting_source_matches_grain(grain_ref, workers):
    def loader(lib):
        return lib.DataLoader(
            data_source=waiting.WaitingSource(N),
            sampler=lib.IndexSampler(N, lib.NoSharding(), shuffle=True, num_epochs=1, seed=7),
            operations=[lib.Batch(8)],
            worker_count=workers,
        )

    theirs, their_states = _run(iter(loader(grain_ref)))
    waiting.reset()
    ours, our_states = _run(iter(loader(grainlike)))
    assert waiting.keys(ours, "key") == waiting.keys(theirs, "key")
    assert our_states == their_states
    assert waiting.max_overlap(ours) >= 4


@pytest.mark.parametrize("workers", [0, 2])
def test_dataset_waiting_map_matches_grain(grain_ref, workers):
    def dataset(lib):
        ds = lib.MapDataset.range(N).shuffle(seed=3).map(waiting.WaitingMap()).to_iter_dataset()
        return ds.mp_prefetch(lib.MultiprocessingOptions(num_workers=workers)) if workers else ds

    theirs, their_states = _run(iter(dataset(grain_ref)))
    waiting.reset()
    ours, our_states = _run(iter(dataset(grainlike)))
    assert [as_plain(x["x"]) for x in ours] == [as_plain(x["x"]) for x in theirs]
    assert our_states == their_states
    assert waiting.max_overlap(ours) >= 4
