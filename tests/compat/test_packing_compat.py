"""Sequence packing against grain 0.2.18: first fit, best fit, concat-then-split, PackAndBatch.

Every case compares the packed elements (keys, dtypes, values), the state before
each element, and restores each library from the other's states mid-pack.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import grainlike
from tests.compat.dataset_pairs import GRAINLIKE, assert_same, check_pipeline, grain_namespace, rest, run
from tests.helpers.leaks import LeakCheck
from tests.helpers.pipelines import as_plain, take

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _quiet_packing_logs():
    # Both libraries log an error per meta feature that limits packing.
    logging.disable(logging.ERROR)
    yield
    logging.disable(logging.NOTSET)


def _records(n=36, seed=0, long=False):
    """Dicts of variable-length sequences: int32 tokens, int64 labels, a 2-D feature, scalars."""
    rng = np.random.default_rng(seed)
    top = 14 if long else 8
    out = []
    for i in range(n):
        t = int(rng.integers(1, top))
        out.append(
            {
                "tokens": rng.integers(1, 1000, t).astype(np.int32),
                "labels": rng.integers(1, 9, int(rng.integers(0, 5))),
                "emb": rng.random((int(rng.integers(1, 4)), 2)).astype(np.float32),
                "id": i,
                "weight": np.float32(i / 2),
            }
        )
    return out


def _only(records, keys):
    return [{k: r[k] for k in keys} for r in records]


class _Lib:
    """One library's names: the Dataset API, grain.experimental and the DataLoader's."""

    def __init__(self, module, namespace):
        self.m = module
        self.x = module.experimental
        # What check_pipeline builds each side from.
        self.namespace = namespace

    def source(self, records):
        return self.m.MapDataset.source(records).to_iter_dataset()


@pytest.fixture(scope="module")
def libs(grain_ref):
    return _Lib(grain_ref, grain_namespace(grain_ref)), _Lib(grainlike, GRAINLIKE)


def _check(libs, build):
    """Same elements and states at every step; each library restores from the other's states."""
    theirs, ours = libs
    return check_pipeline(lambda ns: build(ours if ns is GRAINLIKE else theirs), theirs.namespace)


FIT_CASES = {
    "one_feature": dict(keys=("tokens",), length_struct={"tokens": 10}, num_packing_bins=3),
    # Features outside length_struct and meta_features are dropped.
    "other_features_dropped": dict(
        keys=("tokens", "labels", "emb", "id", "weight"), length_struct={"tokens": 10}, num_packing_bins=3
    ),
    "no_shuffle": dict(keys=("tokens", "labels"), length_struct={"tokens": 10, "labels": 6}, num_packing_bins=3, shuffle_bins=False),
    "one_bin": dict(keys=("tokens", "labels"), length_struct={"tokens": 10, "labels": 6}, num_packing_bins=1, seed=5),
    "many_bins_seed": dict(keys=("tokens", "labels"), length_struct={"tokens": 12, "labels": 7}, num_packing_bins=6, seed=123),
    "trailing_dims": dict(keys=("tokens", "emb"), length_struct={"tokens": 9, "emb": 5}, num_packing_bins=3),
    "scalar_feature": dict(keys=("tokens", "weight"), length_struct={"tokens": 9, "weight": 3}, num_packing_bins=2, seed=1),
    "meta_features": dict(
        keys=("tokens", "labels", "id", "weight"),
        length_struct={"tokens": 10, "labels": 6, "weight": 4},
        meta_features=("id", "weight"),
        num_packing_bins=3,
    ),
    "nested_meta": dict(
        keys=("tokens", "pair"),
        length_struct={"tokens": 10, "pair": {"a": 10, "b": 6}},
        meta_features=("pair",),
        num_packing_bins=2,
    ),
    "alignment_and_padding": dict(
        keys=("tokens", "labels"),
        length_struct={"tokens": 12, "labels": 8},
        pack_alignment_struct={"tokens": 4, "labels": 2},
        padding_struct={"tokens": -1, "labels": 99},
        num_packing_bins=3,
    ),
    "max_sequences_per_bin": dict(
        keys=("tokens", "labels"), length_struct={"tokens": 16, "labels": 12}, num_packing_bins=2, max_sequences_per_bin=2
    ),
    "group_by_feature": dict(
        keys=("tokens", "labels"),
        length_struct={"tokens": 10, "labels": 6},
        num_packing_bins=4,
        shuffle_bins_group_by_feature="labels",
    ),
}


def _fit_records(keys):
    records = _records()
    if "pair" in keys:
        for r in records:
            r["pair"] = {"a": r["tokens"].copy(), "b": r["labels"].astype(np.int16)}
    return _only(records, keys)


@pytest.mark.parametrize("strategy", ["FirstFitPackIterDataset", "BestFitPackIterDataset"])
@pytest.mark.parametrize("case", sorted(FIT_CASES))
def test_fit_packing_matches_grain(libs, strategy, case):
    kwargs = dict(FIT_CASES[case])
    records = _fit_records(kwargs.pop("keys"))
    values = _check(libs, lambda lib: getattr(lib.x, strategy)(lib.source(records), **kwargs))
    assert any(int(v["tokens_segment_ids"].max()) > 1 for v in values), "nothing was packed together"


def test_fit_packing_restores_from_a_json_round_trip(libs):
    _, ours = libs
    ds = ours.x.FirstFitPackIterDataset(ours.source(_fit_records(("tokens",))), length_struct={"tokens": 10}, num_packing_bins=3)
    values, states = run(ds)
    it = iter(ds)
    it.set_state(json.loads(json.dumps(states[4])))
    assert_same(values[4:], rest(it))


def test_packed_batch_size_bytes_matches_grain(libs):
    sizes = []
    for lib in libs:
        it = iter(lib.x.FirstFitPackIterDataset(lib.source(_fit_records(("tokens", "emb"))), length_struct={"tokens": 9, "emb": 5}, num_packing_bins=3))
        with pytest.raises(ValueError):
            it.get_packed_batch_size_bytes()
        next(it)
        sizes.append(it.get_packed_batch_size_bytes())
    assert sizes[0] == sizes[1] > 0


FIT_ERRORS = {
    "longer_than_target": ({"tokens": 4}, {}, ValueError),
    "length_struct_not_a_dict": (10, {}, ValueError),
    "missing_feature": ({"tokens": 10, "absent": 4}, {}, KeyError),
    "missing_meta_feature": ({"tokens": 10}, {"meta_features": ("absent",)}, KeyError),
    "nested_length_not_meta": ({"tokens": 10, "pair": {"a": 4}}, {}, ValueError),
}


@pytest.mark.parametrize("strategy", ["FirstFitPackIterDataset", "BestFitPackIterDataset"])
@pytest.mark.parametrize("case", sorted(FIT_ERRORS))
def test_fit_packing_errors_have_grains_types(libs, strategy, case):
    length_struct, kwargs, error = FIT_ERRORS[case]
    records = _fit_records(("tokens", "pair"))
    for lib in libs:
        ds = getattr(lib.x, strategy)(lib.source(records), length_struct=length_struct, num_packing_bins=2, **kwargs)
        with pytest.raises(error):
            list(ds)


def test_bad_max_sequences_per_bin_is_refused_like_grain(libs):
    for lib in libs:
        with pytest.raises(ValueError, match="max_sequences_per_bin"):
            lib.x.FirstFitPackIterDataset(lib.source([]), length_struct={"t": 4}, num_packing_bins=2, max_sequences_per_bin=0)


def _bos(lib, mode):
    return getattr(lib.x.BOSHandling, mode)


CTS_CASES = {
    "observations": dict(observations=True, length_struct={"observation": 6, "index": 6}, meta_features=("index",)),
    "observations_keep_full_length": dict(
        observations=True,
        length_struct={"observation": 6, "index": 6},
        meta_features=("index",),
        split_full_length_features=False,
    ),
    "one_feature": dict(keys=("tokens",), length_struct={"tokens": 8}),
    "two_features": dict(keys=("tokens", "labels"), length_struct={"tokens": 8, "labels": 5}),
    "keep_full_length": dict(keys=("tokens", "labels"), length_struct={"tokens": 7, "labels": 4}, split_full_length_features=False),
    "meta_feature": dict(keys=("tokens", "labels"), length_struct={"tokens": 9, "labels": 6}, meta_features=("labels",)),
    # A scalar counts as length 1; grain packs it only as a meta feature (never split).
    "scalar_and_2d": dict(
        keys=("tokens", "emb", "weight"), length_struct={"tokens": 9, "emb": 6, "weight": 3}, meta_features=("weight",)
    ),
    "longer_than_target": dict(keys=("tokens",), length_struct={"tokens": 5}, long=True),
    "bos_do_nothing": dict(keys=("tokens",), length_struct={"tokens": 8}, bos_handling="DO_NOTHING"),
    "bos_replace": dict(
        keys=("tokens", "labels"),
        length_struct={"tokens": 10, "labels": 10},
        # A second split feature would trip grain's IndexError when tokens fill exactly.
        meta_features=("labels",),
        bos_handling="REPLACE_FIRST_TOKEN_WITH_BOS",
        bos_features=("tokens",),
        bos_token_id=0,
    ),
    "bos_replace_keep_full_length": dict(
        keys=("tokens",),
        length_struct={"tokens": 6},
        bos_handling="REPLACE_FIRST_TOKEN_WITH_BOS",
        bos_features=("tokens",),
        bos_token_id=7,
        split_full_length_features=False,
        long=True,
    ),
}


def _observations(n=23):
    """grain's own test data: [1], [2, 2], ..., [7] * 7, [1], ..., with a scalar index."""
    return [{"observation": np.repeat(i % 7 + 1, i % 7 + 1), "index": i + 1} for i in range(n)]


def _cts(lib, case):
    kwargs = dict(CTS_CASES[case])
    if kwargs.pop("observations", False):
        records = _observations()
    else:
        records = _only(_records(long=kwargs.pop("long", False)), kwargs.pop("keys"))
    if "bos_handling" in kwargs:
        kwargs["bos_handling"] = _bos(lib, kwargs["bos_handling"])
    return lib.x.ConcatThenSplitIterDataset(lib.source(records), **kwargs)


@pytest.mark.parametrize("case", sorted(CTS_CASES))
def test_concat_then_split_matches_grain(libs, case):
    values = _check(libs, lambda lib: _cts(lib, case))
    key = "observation" if "observation" in values[0] else "tokens"
    assert any(int(v[f"{key}_segment_ids"].max()) > 1 for v in values)


@pytest.mark.parametrize("case", ["two_features", "longer_than_target"])
def test_concat_then_split_restores_from_every_state_of_grain(libs, case):
    theirs, ours = libs
    values, states = run(_cts(theirs, case))
    for k, state in enumerate(states):
        it = iter(_cts(ours, case))
        # A checkpoint stored as JSON has lists where grain's state has tuples.
        it.set_state(json.loads(json.dumps(state)))
        assert it.get_state() == state
        assert_same(values[k:], rest(it), f"state {k}")


CTS_CONFIG_ERRORS = {
    "token_without_bos": dict(bos_token_id=1),
    "features_without_bos": dict(bos_features=("tokens",)),
    "bos_without_token": dict(bos_handling="REPLACE_FIRST_TOKEN_WITH_BOS", bos_features=("tokens",)),
    "bos_meta_overlap": dict(
        bos_handling="REPLACE_FIRST_TOKEN_WITH_BOS", bos_features=("tokens",), meta_features=("tokens",), bos_token_id=1
    ),
}


@pytest.mark.parametrize("case", sorted(CTS_CONFIG_ERRORS))
def test_concat_then_split_refuses_bad_bos_arguments_like_grain(libs, case):
    for lib in libs:
        kwargs = dict(CTS_CONFIG_ERRORS[case])
        if "bos_handling" in kwargs:
            kwargs["bos_handling"] = _bos(lib, kwargs["bos_handling"])
        with pytest.raises(ValueError):
            lib.x.ConcatThenSplitIterDataset(lib.source([]), length_struct={"tokens": 4}, **kwargs)


@pytest.mark.parametrize(
    "records", [[np.arange(3)], [{"tokens": np.arange(3), "other": np.arange(2)}]], ids=["not_a_dict", "other_keys"]
)
def test_concat_then_split_refuses_bad_elements_like_grain(libs, records):
    for lib in libs:
        with pytest.raises(ValueError):
            list(lib.x.ConcatThenSplitIterDataset(lib.source(records), length_struct={"tokens": 4}))


def _pack_and_batch_loader(lib, worker_count=0, num_epochs=1):
    records = _only(_records(n=30), ("tokens", "labels"))
    return lib.m.DataLoader(
        data_source=records,
        sampler=lib.m.IndexSampler(len(records), lib.m.NoSharding(), shuffle=True, num_epochs=num_epochs, seed=3),
        operations=[lib.x.PackAndBatchOperation(length_struct={"tokens": 10, "labels": 6}, batch_size=3)],
        worker_count=worker_count,
    )


def _loader_run(loader):
    it = iter(loader)
    states, outputs = [it.get_state()], []
    for element in it:
        outputs.append(as_plain(element))
        states.append(it.get_state())
    return outputs, states


def test_pack_and_batch_operation_in_a_data_loader_matches_grain(libs):
    theirs, ours = libs
    expected, their_states = _loader_run(_pack_and_batch_loader(theirs))
    actual, our_states = _loader_run(_pack_and_batch_loader(ours))
    assert len(expected) > 3
    assert actual == expected
    assert our_states == their_states
    # A restore starts packing afresh at the sampler's position, in both libraries.
    k = len(expected) // 2
    back = iter(_pack_and_batch_loader(theirs))
    back.set_state(our_states[k])
    mine = iter(_pack_and_batch_loader(ours))
    mine.set_state(their_states[k])
    assert take(mine, 100) == take(back, 100)


def test_pack_and_batch_operation_with_max_sequences_per_bin_matches_grain(libs):
    outputs = []
    for lib in libs:
        op = lib.x.PackAndBatchOperation(length_struct={"tokens": 20}, batch_size=2, max_sequences_per_bin=2)
        loader = lib.m.DataLoader(
            data_source=_only(_records(n=12), ("tokens",)),
            sampler=lib.m.SequentialSampler(12, lib.m.NoSharding()),
            operations=[op],
        )
        outputs.append([as_plain(x) for x in loader])
    assert outputs[0] == outputs[1]
    assert len(outputs[0]) >= 3


def test_pack_and_batch_operation_runs_in_each_worker_as_in_grain(libs):
    theirs, ours = libs
    expected, states = _loader_run(_pack_and_batch_loader(theirs, worker_count=2))
    leaks = LeakCheck()
    with iter(_pack_and_batch_loader(ours, worker_count=2)) as it:
        assert _loader_run(it) == (expected, states)
    leaks.assert_clean()


@pytest.mark.parametrize(
    "length_struct, meta",
    [({"tokens": 8, "doc_id": 8}, ["doc_id", "source"]), ({"t": 4, "m": {"a": 2}}, ["m", "x", "y"]), ({"t": 4}, [])],
)
def test_non_sequence_meta_features_as_grains(grain_ref, length_struct, meta):
    del grain_ref
    from grain._src.python.dataset.transformations import packing_packed_batch

    from grainlike.dataset.transformations.packing import get_non_sequence_meta_features

    assert get_non_sequence_meta_features(length_struct, meta) == (
        packing_packed_batch.get_non_sequence_meta_features(length_struct, meta)
    )


def test_nested_feature_not_marked_meta_raises_grains_message():
    from grainlike.dataset.transformations.packing import PackIterDataset

    elements = [{"row": np.arange(3), "nested": {"inner": 0}}] * 4
    ds = grainlike.experimental.FirstFitPackIterDataset(
        grainlike.MapDataset.source(elements).to_iter_dataset(),
        num_packing_bins=2,
        length_struct={"row": 10, "nested": {"inner": 10}},
    )
    assert isinstance(ds, PackIterDataset)
    with pytest.raises(ValueError, match=r"^Failed to extract segment ids for 'nested', which has type <class 'dict'> "
                                         r"rather than np.ndarray. Perhaps it should be marked as a meta feature\? "):
        next(iter(ds))
