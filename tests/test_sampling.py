"""Sampling modes: draws with replacement, per-epoch reshuffles, padded exact epochs."""

from __future__ import annotations

import json

import numpy as np
import pytest

import grainlike as grain
from grainlike.dataset.conformance import assert_equal_output_after_checkpoint
from grainlike.core.sampling import PaddedEpochSampler, RandomSampler

pytestmark = pytest.mark.timeout(60)

WORKERS = [0, 2]


def ids(loader):
    with iter(loader) as it:
        return [np.asarray(b).tolist() for b in it]


# -- RandomSampler ---------------------------------------------------------------


def test_random_sampler_keys_are_a_pure_function_of_seed_and_index():
    s = RandomSampler(100, num_samples=1000, seed=7)
    keys = s.locate(np.arange(1000)).keys
    assert keys.tolist() == [s[i].record_key for i in range(1000)]
    assert keys.tolist() == RandomSampler(100, num_samples=1000, seed=7).locate(np.arange(1000)).keys.tolist()
    assert keys[500:].tolist() == s.locate(np.arange(500, 1000)).keys.tolist()
    assert keys.tolist() != RandomSampler(100, num_samples=1000, seed=8).locate(np.arange(1000)).keys.tolist()
    assert keys.min() >= 0 and keys.max() < 100


def test_random_sampler_draws_uniformly_with_replacement():
    keys = RandomSampler(10, seed=0).locate(np.arange(100_000)).keys
    counts = np.bincount(keys, minlength=10)
    assert counts.min() > 9_500 and counts.max() < 10_500
    first = RandomSampler(50, seed=1).locate(np.arange(50)).keys
    assert len(set(first.tolist())) < 50  # repeats within one "epoch"


def test_random_sampler_length_and_rngs():
    assert len(RandomSampler(10, num_samples=25, seed=0)) == 25
    import sys

    assert len(RandomSampler(10, seed=0)) == sys.maxsize
    s = RandomSampler(10, num_samples=5, seed=3)
    with pytest.raises(IndexError):
        s[5]
    a, b = s[2].rng.random(), grain.IndexSampler(10, grain.NoSharding(), seed=3)[2].rng.random()
    assert a == b  # the same per-record rng as IndexSampler


def test_random_sampler_sharded_draws_from_its_shard():
    keys = RandomSampler(10, grain.ShardOptions(1, 2), seed=0).locate(np.arange(1000)).keys
    assert set(keys.tolist()) == set(range(5, 10))


@pytest.mark.parametrize("kwargs, error", [
    (dict(num_records=0), ValueError),
    (dict(num_records=5, num_samples=0), ValueError),
    (dict(num_records=5, seed=-1), ValueError),
    (dict(num_records=5, seed=2**32), ValueError),
    (dict(num_records=5, seed="1"), TypeError),
])
def test_random_sampler_rejects_bad_arguments(kwargs, error):
    with pytest.raises(error):
        RandomSampler(**kwargs)


@pytest.mark.parametrize("worker_count", WORKERS)
def test_random_sampler_loader_is_reproducible_and_restores(worker_count, no_leaks):
    sampler = RandomSampler(20, num_samples=30, seed=5)

    def make():
        return grain.DataLoader(data_source=list(range(100, 120)), sampler=sampler,
                                operations=[grain.Batch(4)], worker_count=worker_count)

    expected = sampler.locate(np.arange(30)).keys + 100
    batches = ids(make())
    if worker_count == 0:
        assert sum(batches, []) == expected.tolist()
    else:  # each worker batches its own indices: w, w + W, ...
        assert sorted(sum(batches, [])) == sorted(expected.tolist())
    with iter(make()) as it:
        assert json.loads(it.get_state())["sampler"] == repr(sampler)
    assert_equal_output_after_checkpoint(make())


def test_random_sampler_state_rejected_by_another_seed():
    def make(seed):
        return grain.DataLoader(data_source=list(range(5)),
                                sampler=RandomSampler(5, num_samples=5, seed=seed))

    it = iter(make(0))
    next(it)
    with pytest.raises(grain.InvalidStateError, match="Sampler"):
        iter(make(1)).set_state(it.get_state())


# -- shuffling without replacement (IndexSampler) ------------------------------------


def test_index_sampler_reshuffles_every_epoch():
    s = grain.IndexSampler(20, grain.NoSharding(), shuffle=True, num_epochs=3, seed=0)
    epochs = [[s[e * 20 + i].record_key for i in range(20)] for e in range(3)]
    assert all(sorted(e) == list(range(20)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]


# -- PaddedEpochSampler ----------------------------------------------------------------


def padded_loader(worker_count, num_records=10, batch_size=3, num_epochs=2, shuffle=True,
                  operations=None, sampler_workers=None):
    class Id(grain.MapTransform):
        def map(self, x):
            return {"id": np.int64(x)}

    sampler = PaddedEpochSampler(
        num_records, batch_size,
        worker_count=worker_count if sampler_workers is None else sampler_workers,
        shuffle=shuffle, num_epochs=num_epochs, seed=4,
    )
    ops = [Id(), grain.Batch(batch_size, pad=True)] if operations is None else operations
    return grain.DataLoader(data_source=list(range(num_records)), sampler=sampler,
                            operations=ops, worker_count=worker_count)


def test_padded_epoch_sampler_lengths_and_padding():
    s = PaddedEpochSampler(10, 3, worker_count=2, num_epochs=2)
    assert s.epoch_length == 12 and s.batches_per_epoch == 4 and len(s) == 24
    assert s.locate(np.arange(24)).padding.nonzero()[0].tolist() == [10, 11, 22, 23]
    keys = s.locate(np.arange(24)).keys
    assert keys[:10].tolist() == list(range(10))  # unshuffled: IndexSampler's order
    sharded = PaddedEpochSampler(11, 2, shard_options=grain.ShardOptions(1, 2), num_epochs=1)
    # The largest shard (6 records) sets the epoch length of every shard.
    assert sharded.epoch_length == 6 and len(sharded) == 12


def test_padded_epoch_sampler_real_records_follow_index_sampler_order():
    s = PaddedEpochSampler(10, 4, shuffle=True, num_epochs=3, seed=9)
    ref = grain.IndexSampler(10, grain.NoSharding(), shuffle=True, num_epochs=3, seed=9)
    located = s.locate(np.arange(len(s)))
    keys, pad = located.keys, located.padding
    assert keys[~pad].tolist() == [ref[i].record_key for i in range(30)]


@pytest.mark.parametrize("worker_count", WORKERS)
def test_padded_epochs_never_mix_and_cover_each_record_once(worker_count, no_leaks):
    loader = padded_loader(worker_count)
    sampler = loader.sampler
    with iter(loader) as it:
        batches = [(b["id"].tolist(), b["mask"].tolist()) for b in it]
    assert len(batches) == len(loader) == 2 * sampler.batches_per_epoch
    per_epoch = sampler.batches_per_epoch
    for epoch in range(2):
        chunk = batches[epoch * per_epoch:(epoch + 1) * per_epoch]
        real = [i for ids_, mask in chunk for i, m in zip(ids_, mask) if m]
        assert sorted(real) == list(range(10))
        padded = [i for ids_, mask in chunk for i, m in zip(ids_, mask) if not m]
        assert padded == [0] * (sampler.epoch_length - 10)


@pytest.mark.parametrize("worker_count", WORKERS)
def test_padded_epoch_restore_continues_identically(worker_count, no_leaks):
    assert_equal_output_after_checkpoint(padded_loader(worker_count))


def test_padded_epoch_sampler_needs_padded_batch():
    loader = padded_loader(0, operations=[grain.Batch(3)])
    with pytest.raises(ValueError, match=r"needs Batch\(batch_size=3, pad=True\)"):
        next(iter(loader))
    loader = padded_loader(0, operations=[grain.Batch(2, pad=True)])
    with pytest.raises(ValueError, match="needs Batch"):
        next(iter(loader))


def test_padded_epoch_sampler_needs_its_worker_count():
    loader = padded_loader(0, sampler_workers=2)
    with pytest.raises(ValueError, match="worker_count=2"):
        next(iter(loader))


def test_padded_epoch_sampler_rejects_filter_before_batch():
    class Keep(grain.FilterTransform):
        def filter(self, x):
            return True

    loader = padded_loader(0, operations=[Keep(), grain.Batch(3, pad=True)])
    with pytest.raises(ValueError, match="FilterTransform"):
        next(iter(loader))
