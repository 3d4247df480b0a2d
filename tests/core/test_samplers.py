"""IndexSampler / SequentialSampler against grain's reference vectors in tests/data."""

import builtins
import json
import os
import pickle

import numpy as np
import pytest

from grainlike.core import samplers
from grainlike.core.record import RecordMetadata, philox_generator
from grainlike.core.sampling import PaddedEpochSampler, RandomSampler
from grainlike.core.sharding import NoSharding, ShardOptions

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
with open(os.path.join(DATA, "index_sampler_vectors.json")) as _f:
    VECTORS = json.load(_f)


def _shard(spec):
    if spec == ["none"]:
        return NoSharding()
    return ShardOptions(shard_index=spec[0], shard_count=spec[1], drop_remainder=spec[2])


def _make(v):
    return samplers.IndexSampler(
        num_records=v["num_records"],
        shard_options=_shard(v["shard"]),
        shuffle=v["shuffle"],
        num_epochs=v["num_epochs"],
        seed=v["seed"],
    )


@pytest.mark.parametrize("v", VECTORS, ids=lambda v: v.get("repr", v.get("error", "")))
def test_index_sampler_matches_reference_vectors(v):
    if "error" in v:
        s = _make(v)
        with pytest.raises(getattr(builtins, v["error"])):
            s[0]
        return
    s = _make(v)
    assert len(s) == v["len"]
    assert repr(s) == v["repr"]
    indices = np.array([m[0] for m in v["metadata"]], dtype=np.int64)
    for index, key, draws in v["metadata"]:
        meta = s[index]
        assert meta.index == index
        assert meta.record_key == key
        assert meta.rng.integers(0, 2**31, size=2).tolist() == draws
    located = s.locate(indices)
    assert located.keys.tolist() == [m[1] for m in v["metadata"]]
    assert located.padding is None and located.metadata is None
    if v["seed"] is None:
        assert located.seeds is None
    else:
        draws = [philox_generator(k).integers(0, 2**31, size=2).tolist() for k in located.seeds.tolist()]
        assert draws == [m[2] for m in v["metadata"]]


def test_empty_shard_error_is_zero_division_and_value_error():
    s = samplers.IndexSampler(1, ShardOptions(1, 3), num_epochs=1, seed=0)
    with pytest.raises(ZeroDivisionError, match="holds no records"):
        s[0]
    with pytest.raises(ValueError):
        s.locate(np.arange(1)).keys


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        (dict(num_records=0), ValueError),
        (dict(num_records=-3), ValueError),
        (dict(num_records=5, num_epochs=0), ValueError),
        (dict(num_records=5, shuffle=True), ValueError),
        (dict(num_records=5, shuffle=True, seed=1.5), TypeError),
        (dict(num_records=5, seed=-1), ValueError),
        (dict(num_records=5, seed=2**32), ValueError),
    ],
)
def test_invalid_arguments_raise_reference_exception_types(kwargs, exc):
    with pytest.raises(exc):
        samplers.IndexSampler(**kwargs)


def test_index_past_end_raises_index_error():
    s = samplers.IndexSampler(4, num_epochs=2, seed=0)
    assert s[7].record_key == 3
    with pytest.raises(IndexError, match="out of bounds"):
        s[8]
    with pytest.raises(IndexError):
        s[-1]


def test_infinite_sampler_len_is_maxsize_and_keeps_going():
    s = samplers.IndexSampler(3, shuffle=True, seed=1)
    import sys

    assert len(s) == sys.maxsize
    epochs = [sorted(s[i].record_key for i in range(e * 3, e * 3 + 3)) for e in range(50)]
    assert all(e == [0, 1, 2] for e in epochs)


def test_shuffle_changes_every_epoch_and_is_a_permutation():
    s = samplers.IndexSampler(100, shuffle=True, num_epochs=3, seed=123)
    keys = s.locate(np.arange(300)).keys.reshape(3, 100)
    for epoch in keys:
        assert sorted(epoch.tolist()) == list(range(100))
    assert keys[0].tolist() != keys[1].tolist()


def test_vectorised_keys_equal_per_index_keys_across_epochs_and_shards():
    for shard in [NoSharding(), ShardOptions(2, 3), ShardOptions(1, 4, True)]:
        s = samplers.IndexSampler(37, shard, shuffle=True, num_epochs=4, seed=99)
        idx = np.arange(len(s))
        assert s.locate(idx).keys.tolist() == [s[int(i)].record_key for i in idx]


def test_rng_is_lazy_but_draws_equal_eager_philox():
    s = samplers.IndexSampler(10, num_epochs=1, seed=5)
    meta = s[3]
    eager = np.random.Generator(np.random.Philox(key=5 + 3))
    assert meta.rng.random(4).tolist() == eager.random(4).tolist()


def test_no_seed_means_no_rng():
    assert samplers.IndexSampler(3, num_epochs=1)[0].rng is None


def test_sequential_sampler_reads_in_order_with_repr_and_len():
    s = samplers.SequentialSampler(5, ShardOptions(0, 2, drop_remainder=True), seed=3)
    assert len(s) == 4
    assert [s[i].record_key for i in range(4)] == [0, 1, 2, 3]
    assert repr(s) == (
        "SequentialSampler(num_records=5, shard_options=ShardOptions(shard_index=0, "
        "shard_count=2, drop_remainder=True))"
    )
    with pytest.raises(IndexError):
        s[4]


def test_samplers_and_metadata_pickle():
    s = samplers.IndexSampler(10, shuffle=True, num_epochs=1, seed=5)
    s2 = pickle.loads(pickle.dumps(s))
    assert repr(s2) == repr(s) and s2[4].record_key == s[4].record_key
    m = pickle.loads(pickle.dumps(s[2]))
    assert isinstance(m, RecordMetadata) and m.rng.random() == s[2].rng.random()


# -- the sampler contract ---------------------------------------------------------------

CONTRACT_SAMPLERS = [
    samplers.IndexSampler(11, ShardOptions(1, 3), shuffle=True, num_epochs=3, seed=7),
    samplers.IndexSampler(5, num_epochs=2),
    samplers.SequentialSampler(9, ShardOptions(0, 2, drop_remainder=True), seed=2),
    samplers.SequentialSampler(4),
    RandomSampler(13, ShardOptions(1, 2), num_samples=20, seed=3),
    PaddedEpochSampler(7, 3, worker_count=2, shuffle=True, num_epochs=2, seed=1),
    PaddedEpochSampler(10, 4, shard_options=ShardOptions(0, 3), num_epochs=1),
]


@pytest.mark.parametrize("s", CONTRACT_SAMPLERS, ids=repr)
def test_locate_agrees_with_getitem_on_keys_rngs_and_bounds(s):
    idx = np.arange(len(s), dtype=np.int64)
    located = samplers.as_sampler(s).locate(idx)
    assert samplers.as_sampler(s) is s and isinstance(located, samplers.SampledIndices)
    metas = [s[i] for i in idx.tolist()]
    assert located.keys.dtype == np.int64
    assert located.keys.tolist() == [m.record_key for m in metas]
    if located.seeds is None:
        assert all(m.rng is None for m in metas)
    else:
        assert [philox_generator(k).random() for k in located.seeds.tolist()] == [m.rng.random() for m in metas]
    # Any run of indices, in any order, gives the same answers.
    part = idx[::-3]
    assert s.locate(part).keys.tolist() == located.keys[part].tolist()
    with pytest.raises(IndexError, match="out of bounds"):
        s[len(s)]
    with pytest.raises(IndexError):
        s[-1]


def test_only_padding_samplers_report_padding_and_their_batch_layout():
    for s in CONTRACT_SAMPLERS:
        if isinstance(s, PaddedEpochSampler):
            assert s.batch_padding == samplers.BatchPadding(s.batch_size, s.worker_count)
        else:
            assert s.batch_padding is None and s.locate(np.arange(len(s))).padding is None
    two_epochs, sharded = [s for s in CONTRACT_SAMPLERS if isinstance(s, PaddedEpochSampler)]
    # 7 records padded to 12 (whole batches of 3 for 2 workers), twice.
    padding = two_epochs.locate(np.arange(24)).padding
    assert padding.dtype == bool and padding.nonzero()[0].tolist() == [7, 8, 9, 10, 11, 19, 20, 21, 22, 23]
    # Shard 0 of 10 records over 3 shards holds the largest share (4): no padding.
    assert not sharded.locate(np.arange(len(sharded))).padding.any()


class GrainStyleSampler:
    """grain's Sampler protocol only: no len, no locate; keys count down."""

    def __init__(self, n):
        self.n = n

    def __getitem__(self, index):
        if not 0 <= index < self.n:
            raise IndexError(index)
        return RecordMetadata(index=index, record_key=self.n - 1 - index, rng=np.random.default_rng(index))

    def __repr__(self):
        return f"GrainStyleSampler({self.n})"


def test_as_sampler_wraps_grain_protocol_samplers_once_and_keeps_their_metadata():
    inner = GrainStyleSampler(6)
    wrapped = samplers.as_sampler(inner)
    assert isinstance(wrapped, samplers.BaseSampler) and repr(wrapped) == "GrainStyleSampler(6)"
    assert len(wrapped) == 6  # found by bisection
    located = wrapped.locate(np.array([0, 4]))
    assert located.keys.tolist() == [5, 1] and located.seeds is None and located.padding is None
    assert [m.index for m in located.metadata] == [0, 4]
    assert located.metadata[1].rng.random() == np.random.default_rng(4).random()
    assert wrapped[2].record_key == 3
    with pytest.raises(TypeError, match="sampler must map a global index"):
        samplers.as_sampler(42)


def test_loader_reads_through_a_wrapped_sampler_with_its_rngs():
    import grainlike as grain

    class AddDraw(grain.RandomMapTransform):
        def random_map(self, x, rng):
            return (x, rng.integers(0, 1000))

    loader = grain.DataLoader(
        data_source=list(range(6)), sampler=GrainStyleSampler(6), operations=[AddDraw()],
        shard_options=NoSharding(),
    )
    out = [(int(x), int(d)) for x, d in loader]
    assert out == [(5 - i, int(np.random.default_rng(i).integers(0, 1000))) for i in range(6)]
