"""Packing stages: restore at every step (in process and under mp_prefetch), states, closing."""

from __future__ import annotations

import numpy as np
import pytest

from grainlike.dataset import MapDataset
from grainlike.dataset.conformance import assert_equal_output_after_checkpoint
from grainlike.dataset.nodes.options import MultiprocessingOptions
from grainlike.dataset.transformations.packing import BestFitPackIterDataset, FirstFitPackIterDataset
from grainlike.dataset.transformations.packing_concat_split import BOSHandling, ConcatThenSplitIterDataset

pytestmark = pytest.mark.timeout(120)


def _source(n=24, seed=0):
    rng = np.random.default_rng(seed)
    return MapDataset.source(
        [
            {"tokens": rng.integers(1, 100, int(rng.integers(1, 9))).astype(np.int32), "labels": rng.integers(1, 9, int(rng.integers(1, 5)))}
            for _ in range(n)
        ]
    ).to_iter_dataset()


STAGES = {
    "first_fit": lambda ds: FirstFitPackIterDataset(ds, length_struct={"tokens": 10, "labels": 6}, num_packing_bins=3, seed=4),
    "best_fit": lambda ds: BestFitPackIterDataset(ds, length_struct={"tokens": 10, "labels": 6}, num_packing_bins=3, shuffle_bins=False),
    "concat_then_split": lambda ds: ConcatThenSplitIterDataset(ds, length_struct={"tokens": 10, "labels": 6}),
    "concat_then_split_bos": lambda ds: ConcatThenSplitIterDataset(
        ds,
        length_struct={"tokens": 7, "labels": 6},
        meta_features=("labels",),
        bos_handling=BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS,
        bos_features=("tokens",),
        bos_token_id=0,
    ),
}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_restores_at_every_step(stage):
    assert_equal_output_after_checkpoint(STAGES[stage](_source()))


@pytest.mark.parametrize("stage", ["first_fit", "concat_then_split"])
def test_restores_at_every_step_under_mp_prefetch(no_leaks, stage):
    ds = STAGES[stage](_source(n=14)).batch(2).mp_prefetch(MultiprocessingOptions(num_workers=2))
    assert_equal_output_after_checkpoint(ds)


def test_every_token_is_packed_once_with_its_positions():
    ds = _source(n=40)
    packed = list(FirstFitPackIterDataset(ds, length_struct={"tokens": 10, "labels": 6}, num_packing_bins=4))
    # Rebuild the original sequences from segment ids and positions.
    sequences = []
    for p in packed:
        ids, pos = p["tokens_segment_ids"], p["tokens_positions"]
        for s in range(1, ids.max() + 1):
            where = ids == s
            np.testing.assert_array_equal(pos[where], np.arange(where.sum()))
            sequences.append(tuple(p["tokens"][where]))
        assert (p["tokens"][ids == 0] == 0).all()
    assert sorted(sequences) == sorted(tuple(x["tokens"]) for x in ds)


def test_bad_states_are_refused_before_anything_changes():
    it = iter(STAGES["first_fit"](_source()))
    next(it)
    state = it.get_state()
    with pytest.raises(KeyError):
        it.set_state({"parent": state["parent"], "next_row": 0})
    with pytest.raises(IndexError):
        it.set_state({**state, "next_row": -1})
    assert it.get_state() == state
    it = iter(STAGES["concat_then_split"](_source()))
    with pytest.raises(TypeError):
        it.set_state({"parent_state": it.get_state()["parent_state"]})


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_closed_iterator_refuses_next(stage):
    it = iter(STAGES[stage](_source()))
    next(it)
    it.close()
    with pytest.raises(ValueError, match="closed"):
        next(it)


def test_concat_then_split_features_not_matching_the_lengths_raise_grains_message_then_which_differ():
    ds = MapDataset.source([{"a": np.arange(3), "b": np.arange(2)}]).to_iter_dataset()
    with pytest.raises(ValueError) as raised:
        list(ConcatThenSplitIterDataset(ds, length_struct={"a": 4, "c": 4}))
    assert str(raised.value) == (
        "Parent element has structure {'a': 'int64[3]', 'b': 'int64[2]'} but target sequence length is "
        "{'a': 4, 'c': 4}. There must be a sequence length for each feature. Features without a length: "
        "['b']; lengths without a feature: ['c']."
    )
