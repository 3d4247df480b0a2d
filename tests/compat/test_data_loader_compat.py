"""grainlike's DataLoader against grain 0.2.18's, in process (worker_count=0).

Same recipe in both libraries: same elements in the same order, the same
``get_state()`` JSON after k steps, and a state from either restores in the other
and continues identically.
"""

import json

import numpy as np
import pytest

import grainlike
from tests.helpers.pipelines import as_plain, build, take

N_RANGE = 23


def _sources(lib, kind, tmp_path):
    if kind == "list":
        return list(range(N_RANGE)), N_RANGE
    if kind == "range":
        return lib.RangeDataSource(0, N_RANGE, 1), N_RANGE
    if kind == "array_record":
        path = tmp_path / "data.array_record"
        if not path.exists():
            from array_record.python.array_record_module import ArrayRecordWriter

            w = ArrayRecordWriter(str(path), "group_size:1")
            for i in range(N_RANGE):
                w.write(str(i).encode())
            w.close()
        return lib.ArrayRecordDataSource([str(path)]), N_RANGE
    raise ValueError(kind)


CASES = [
    # (source, epochs, shuffle, seed, shard, ops, drop_remainder)
    ("list", 1, False, 0, None, ["map"], False),
    ("list", 2, True, 7, None, ["map", "batch"], False),
    ("range", 3, True, 42, (1, 3, False), ["map", "rand", "batch"], True),
    ("range", 2, True, 5, (0, 2, True), ["map", "filter", "batch"], False),
    ("list", 2, False, 1, (2, 3, False), ["map", "rand", "rand2", "filter"], False),
    ("array_record", 2, True, 3, None, ["int", "map", "rand", "batch"], False),
    ("array_record", 1, False, 0, (1, 2, True), ["int", "map", "filter", "batch"], True),
    ("range", None, True, 11, None, ["map", "batch"], False),
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_same_outputs_state_and_cross_restore(grain_ref, tmp_path, case):
    kind, epochs, shuffle, seed, shard, ops, drop = case
    src_g, n = _sources(grain_ref, kind, tmp_path)
    src_l, _ = _sources(grainlike, kind, tmp_path)
    kw = dict(num_records=n, num_epochs=epochs, shuffle=shuffle, seed=seed, shard=shard,
              ops=ops, drop_remainder=drop, batch_size=4)
    lg = build(grain_ref, src_g, **kw)
    ll = build(grainlike, src_l, **kw)
    limit = 40  # infinite samplers: compare a prefix
    full_g = take(iter(lg), limit)
    full_l = take(iter(ll), limit)
    assert full_l == full_g
    assert len(full_g) > 0

    for k in sorted({0, 1, len(full_g) // 2, len(full_g)}):
        ig, il = iter(lg), iter(ll)
        assert take(ig, k) == take(il, k) == full_g[:k]
        sg, sl = ig.get_state(), il.get_state()
        assert json.loads(sl) == json.loads(sg)
        assert sl == sg  # byte-for-byte, indent included
        rest = full_g[k:]
        # grain's state restores in grainlike ...
        il2 = iter(ll)
        il2.set_state(sg)
        assert take(il2, len(rest)) == rest
        # ... and grainlike's in grain.
        ig2 = iter(lg)
        ig2.set_state(sl)
        assert take(ig2, len(rest)) == rest


def test_state_after_exhaustion_matches(grain_ref):
    kw = dict(num_records=10, num_epochs=1, shuffle=True, seed=3, shard=None,
              ops=["map", "filter", "batch"], batch_size=4)
    ig = iter(build(grain_ref, list(range(10)), **kw))
    il = iter(build(grainlike, list(range(10)), **kw))
    assert [as_plain(x) for x in ig] == [as_plain(x) for x in il]
    assert il.get_state() == ig.get_state()


@pytest.mark.parametrize("threads", [0, 4])
def test_read_threads_do_not_change_order(grain_ref, threads):
    kw = dict(num_records=50, num_epochs=2, shuffle=True, seed=9, shard=None,
              ops=["map", "rand", "batch"], batch_size=8, read_threads=threads)
    g = take(iter(build(grain_ref, list(range(50)), **kw)), 100)
    l = take(iter(build(grainlike, list(range(50)), **kw)), 100)
    assert l == g


def test_load_matches(grain_ref):
    g = grain_ref.load(list(range(17)), num_epochs=2, shuffle=True, seed=4, batch_size=5)
    l = grainlike.load(list(range(17)), num_epochs=2, shuffle=True, seed=4, batch_size=5)
    assert [as_plain(x) for x in l] == [as_plain(x) for x in g]
    ig, il = iter(g), iter(l)
    next(ig), next(il)
    assert ig.get_state() == il.get_state()


def test_sampler_fallback_shard_options_matches(grain_ref):
    # grain takes the sampler's shard options when the loader has none.
    def make(lib):
        s = lib.IndexSampler(num_records=9, shard_options=lib.ShardOptions(1, 2), shuffle=True, num_epochs=1, seed=2)
        return lib.DataLoader(data_source=list(range(9)), sampler=s)

    assert [as_plain(x) for x in make(grainlike)] == [as_plain(x) for x in make(grain_ref)]
