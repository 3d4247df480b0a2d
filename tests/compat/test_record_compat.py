"""``Record`` and ``RecordMetadata`` behave as grain 0.2.18's dataclasses.

grainlike's ``RecordMetadata`` keeps the rng as a placeholder until it is read
(``LazyRng``); everything a user can observe is compared with grain's class.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import re

import numpy as np
import pytest

from grainlike.core.record import LazyRng, Record, RecordMetadata


def _addressless(text: str) -> str:
    return re.sub(r" at 0x[0-9A-Fa-f]+", " at 0x?", text)


def _pair(lib, index=3, record_key=7, seed=None, lazy=False):
    if seed is None:
        rng = None
    elif lazy:
        rng = LazyRng(seed)
    else:
        rng = np.random.Generator(np.random.Philox(key=seed))
    return lib.RecordMetadata(index=index, record_key=record_key, rng=rng)


def test_fields_and_defaults_are_grains(grain_ref):
    theirs = [(f.name, f.default) for f in dataclasses.fields(grain_ref.RecordMetadata)]
    ours = [(f.name, f.default) for f in dataclasses.fields(RecordMetadata)]
    assert ours == theirs
    assert [f.name for f in dataclasses.fields(Record)] == [
        f.name for f in dataclasses.fields(grain_ref.Record)
    ]
    assert dataclasses.is_dataclass(RecordMetadata(0))


@pytest.mark.parametrize(
    "args,kwargs",
    [((5,), {}), ((5, 2), {}), ((), {"index": 5}), ((), {"index": 5, "record_key": 9}), ((1, None, None), {})],
)
def test_construction_repr_and_str_match(grain_ref, args, kwargs):
    theirs = grain_ref.RecordMetadata(*args, **kwargs)
    ours = RecordMetadata(*args, **kwargs)
    assert repr(ours) == repr(theirs)
    assert str(ours) == str(theirs)
    assert (ours.index, ours.record_key, ours.rng) == (theirs.index, theirs.record_key, theirs.rng)
    record_theirs = grain_ref.Record(metadata=theirs, data={"x": 1})
    assert repr(Record(metadata=ours, data={"x": 1})) == repr(record_theirs)


class _Grainlike:
    RecordMetadata = RecordMetadata


@pytest.mark.parametrize("lazy", [False, True])
def test_repr_and_str_with_an_rng_match(grain_ref, lazy):
    theirs = _pair(grain_ref, seed=11)
    ours = _pair(_Grainlike, seed=11, lazy=lazy)
    assert _addressless(repr(ours)) == _addressless(repr(theirs))
    assert str(ours) == str(theirs)


def test_equality_matches(grain_ref):
    cases = [
        ((1, 2), (1, 2)),
        ((1, 2), (1, 3)),
        ((1, None), (1, None)),
        ((2, 2), (1, 2)),
    ]
    for a, b in cases:
        assert (RecordMetadata(*a) == RecordMetadata(*b)) == (
            grain_ref.RecordMetadata(*a) == grain_ref.RecordMetadata(*b)
        )
    # Generators compare by identity: equal only when it is the same generator.
    g = np.random.Generator(np.random.Philox(key=1))
    assert (grain_ref.RecordMetadata(1, 2, g) == grain_ref.RecordMetadata(1, 2, g)) is True
    assert RecordMetadata(1, 2, g) == RecordMetadata(1, 2, g)
    assert (
        grain_ref.RecordMetadata(1, 2, np.random.Generator(np.random.Philox(key=1)))
        != grain_ref.RecordMetadata(1, 2, np.random.Generator(np.random.Philox(key=1)))
    )
    assert RecordMetadata(1, 2, LazyRng(1)) != RecordMetadata(1, 2, LazyRng(1))
    assert RecordMetadata(1, 2) != grain_ref.RecordMetadata(1, 2)  # different classes


def test_unhashable_as_grains(grain_ref):
    with pytest.raises(TypeError) as theirs:
        hash(grain_ref.RecordMetadata(1))
    with pytest.raises(type(theirs.value)):
        hash(RecordMetadata(1))


@pytest.mark.parametrize("record_key", [None, 4])
def test_remove_record_key_matches(grain_ref, record_key):
    theirs = grain_ref.RecordMetadata(3, record_key, np.random.Generator(np.random.Philox(key=5)))
    ours = RecordMetadata(3, record_key, LazyRng(5))
    t, o = theirs.remove_record_key(), ours.remove_record_key()
    assert (t is theirs) == (o is ours)
    assert (o.index, o.record_key) == (t.index, t.record_key)
    # The copy shares the generator: drawing from one advances the other, as in grain.
    assert t.rng is theirs.rng and o.rng is ours.rng
    assert ours.rng.random() == theirs.rng.random()
    assert o.rng.random() == t.rng.random()


def test_dataclasses_functions_work_as_on_grains(grain_ref):
    theirs, ours = grain_ref.RecordMetadata(2, 8), RecordMetadata(2, 8)
    assert dataclasses.asdict(ours) == dataclasses.asdict(theirs)
    assert dataclasses.astuple(ours) == dataclasses.astuple(theirs)
    replaced = dataclasses.replace(ours, record_key=None)
    assert type(replaced) is RecordMetadata
    assert repr(replaced) == repr(dataclasses.replace(theirs, record_key=None))
    assert copy.deepcopy(ours) == ours


def test_mutable_fields_as_grains():
    meta = RecordMetadata(1, 2, LazyRng(3))
    meta.index, meta.record_key = 10, 20
    g = np.random.Generator(np.random.Philox(key=4))
    meta.rng = g
    assert (meta.index, meta.record_key, meta.rng) == (10, 20, g)
    record = Record(meta, "data")
    record.data = "other"
    assert record.data == "other"


def test_lazy_rng_draws_what_grains_sampler_rng_draws(grain_ref):
    sampler = grain_ref.IndexSampler(
        5, grain_ref.NoSharding(), shuffle=True, num_epochs=1, seed=42
    )
    for i in range(5):
        theirs = sampler[i].rng
        ours = RecordMetadata(i, None, LazyRng(42 + i)).rng
        assert ours.integers(0, 2**31, 4).tolist() == theirs.integers(0, 2**31, 4).tolist()


def test_pickled_metadata_keeps_its_rng_position():
    meta = RecordMetadata(1, 2, LazyRng(6))
    first = meta.rng.random()
    copy_ = pickle.loads(pickle.dumps(meta))
    reference = np.random.Generator(np.random.Philox(key=6))
    assert reference.random() == first
    assert copy_.rng.random() == reference.random()
    unbuilt = pickle.loads(pickle.dumps(RecordMetadata(1, 2, LazyRng(6))))
    assert unbuilt.rng.random() == first
