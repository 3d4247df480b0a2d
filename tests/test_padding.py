"""Batch(..., pad=True): a full-size final batch with zeros and a boolean mask."""

from __future__ import annotations

import json

import numpy as np
import pytest

import grainlike as grain
from grainlike.dataset.conformance import assert_equal_output_after_checkpoint

pytestmark = pytest.mark.timeout(60)

WORKERS = [0, 2]


def make_loader(worker_count=0, num_records=10, batch_size=4, pad=True, as_dict=True,
                shuffle=False, batch_fn=None):
    class Features(grain.MapTransform):
        def map(self, x):
            x = np.int64(x)
            if not as_dict:
                return np.full((3,), x, np.float32)
            return {"id": x, "v": np.full((3,), x, np.float32)}

    return grain.DataLoader(
        data_source=list(range(num_records)),
        sampler=grain.IndexSampler(num_records, grain.NoSharding(), shuffle=shuffle,
                                   num_epochs=1, seed=1),
        operations=[Features(), grain.Batch(batch_size, pad=pad, batch_fn=batch_fn)],
        worker_count=worker_count,
    )


@pytest.mark.parametrize("worker_count", WORKERS)
def test_every_batch_has_full_shape_and_mask_covers_each_record_once(worker_count, no_leaks):
    batches = list(make_loader(worker_count, num_records=10, batch_size=4))
    for b in batches:
        assert set(b) == {"id", "v", "mask"}
        assert b["id"].shape == (4,) and b["v"].shape == (4, 3) and b["mask"].shape == (4,)
        assert b["mask"].dtype == np.bool_
        assert not b["id"][~b["mask"]].any() and not b["v"][~b["mask"]].any()
    real = np.concatenate([b["id"][b["mask"]] for b in batches])
    assert sorted(real.tolist()) == list(range(10))
    # Each worker pads its own last batch: W partial batches at most.
    assert sum(not b["mask"].all() for b in batches) <= max(worker_count, 1)


def test_padded_batches_hold_the_same_records_as_unpadded():
    plain = list(make_loader(0, pad=False, shuffle=True))
    padded = list(make_loader(0, pad=True, shuffle=True))
    assert len(plain) == len(padded) == len(make_loader(0, pad=True)) == 3
    for p, q in zip(plain, padded):
        n = len(p["id"])
        assert q["mask"].tolist() == [True] * n + [False] * (4 - n)
        np.testing.assert_array_equal(q["id"][:n], p["id"])


def test_non_dict_elements_become_data_and_mask():
    batches = list(make_loader(0, as_dict=False))
    assert all(set(b) == {"data", "mask"} for b in batches)
    assert batches[-1]["data"].shape == (4, 3)
    assert batches[-1]["mask"].tolist() == [True, True, False, False]


def test_batch_fn_receives_the_padded_elements():
    seen = []

    def batch_fn(values):
        seen.append(len(values))
        return {"n": np.int64(len(values))}

    batches = list(make_loader(0, batch_fn=batch_fn))
    assert seen == [4, 4, 4]
    assert batches[-1]["mask"].tolist() == [True, True, False, False]


def test_element_with_mask_key_is_rejected():
    class HasMask(grain.MapTransform):
        def map(self, x):
            return {"mask": np.int64(x)}

    loader = grain.DataLoader(
        data_source=list(range(3)), sampler=grain.SequentialSampler(3, grain.NoSharding()),
        operations=[HasMask(), grain.Batch(2, pad=True)],
    )
    with pytest.raises(ValueError, match="already have a 'mask' key"):
        list(loader)


def test_pad_with_drop_remainder_is_rejected():
    with pytest.raises(ValueError, match="choose one"):
        grain.Batch(4, drop_remainder=True, pad=True)
    with pytest.raises(TypeError, match="pad must be a bool"):
        grain.Batch(4, pad=1)


def test_pad_is_the_last_field_after_grains():
    import dataclasses

    assert [f.name for f in dataclasses.fields(grain.Batch)] == [
        "batch_size", "drop_remainder", "batch_fn", "pad"]


@pytest.mark.parametrize("worker_count", WORKERS)
def test_state_is_the_same_as_without_padding(worker_count, no_leaks):
    states = {}
    for pad in (False, True):
        with iter(make_loader(worker_count, pad=pad)) as it:
            states[pad] = []
            for _ in it:
                states[pad].append(json.loads(it.get_state()))
    assert states[True] == states[False]


@pytest.mark.parametrize("worker_count", WORKERS)
def test_restore_mid_epoch_continues_identically(worker_count, no_leaks):
    loader = make_loader(worker_count, num_records=13, batch_size=3, shuffle=True)
    assert_equal_output_after_checkpoint(loader)  # padded last batches included
