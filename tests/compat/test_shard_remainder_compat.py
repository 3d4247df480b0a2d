"""The DataLoader's sharding against grain's: main's with drop_remainder=False, 0.2.18's with True.

grain's main branch changed one thing in the DataLoader after 0.2.18: without
``drop_remainder`` the first ``len(sampler) % shard_count`` shards read one more
position (``tests/compat/grain_main.py`` gives grain 0.2.18's DataLoader main's
shard length). Every shard of each case is compared: the same outputs in the
same order, byte-identical ``get_state()`` JSON part-way and at the end, and a
state from either library restores in the other. With ``drop_remainder=True``
the reference is grain 0.2.18 as released.
"""

import json

import pytest

import grainlike
from tests.compat.grain_main import reference_main_loader
from tests.helpers.pipelines import make_ops, take


@pytest.fixture
def grain_main(grain_ref, monkeypatch):
    return reference_main_loader(grain_ref, monkeypatch)


def _loader(lib, *, sampler, n, shard, drop, epochs=1, shuffle=False, ops=(), workers=0):
    options = lib.ShardOptions(shard_index=shard[0], shard_count=shard[1], drop_remainder=drop)
    if sampler == "index":
        s = lib.IndexSampler(n, options, shuffle=shuffle, num_epochs=epochs, seed=3)
    elif sampler == "index_unsharded":  # the loader shards an unsharded stream
        s = lib.IndexSampler(n, lib.NoSharding(), shuffle=shuffle, num_epochs=epochs, seed=3)
    elif sampler == "sequential":
        s = lib.SequentialSampler(n, options, seed=3)
    else:
        raise ValueError(sampler)
    return lib.DataLoader(
        data_source=list(range(n)),
        sampler=s,
        operations=make_ops(lib, ops, batch_size=2),
        worker_count=workers,
        shard_options=options,
    )


def test_the_reference_is_grain_mains_own_case(grain_ref, monkeypatch):
    # grain main's test_data_loader_sharding_drop_remainder: SequentialSampler(10),
    # shard 0 of 3 without drop_remainder reads [0, 3, 6, 9]; grain 0.2.18 reads
    # [0, 3, 6]. The reference must give main's values, and grainlike too.
    kw = dict(sampler="sequential", n=10, shard=(0, 3), drop=False)
    assert list(_loader(grain_ref, **kw)) == [0, 3, 6]
    main = reference_main_loader(grain_ref, monkeypatch)
    assert list(_loader(main, **kw)) == [0, 3, 6, 9]
    assert list(_loader(main, **{**kw, "drop": True})) == [0, 3, 6]
    assert list(_loader(main, **{**kw, "shard": (1, 3)})) == [1, 4, 7]
    assert list(_loader(grainlike, **kw)) == [0, 3, 6, 9]
    assert list(_loader(grainlike, **{**kw, "drop": True})) == [0, 3, 6]
    assert list(_loader(grainlike, **{**kw, "shard": (1, 3)})) == [1, 4, 7]


CASES = [
    # (sampler, num_records, shard_count, epochs, shuffle, ops)
    ("index", 10, 3, 1, False, []),
    ("index", 10, 3, 1, True, ["map", "rand"]),
    ("index", 10, 3, 2, True, ["map"]),
    ("index", 11, 4, 3, True, ["map", "batch"]),
    ("index", 7, 4, 1, False, ["map", "filter", "batch"]),
    ("index_unsharded", 10, 3, 2, True, ["map", "rand", "batch"]),
    ("index_unsharded", 9, 4, None, True, ["map"]),
    ("sequential", 10, 3, 1, False, ["map", "rand"]),
    ("sequential", 13, 5, 1, False, ["map", "batch"]),
]


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}of{c[2]}-e{c[3]}-{i}" for i, c in enumerate(CASES)])
def test_every_shard_matches_grain(grain_ref, grain_main, case, drop):
    sampler, n, count, epochs, shuffle, ops = case
    reference = grain_main if not drop else grain_ref
    limit = 40  # infinite samplers: compare a prefix
    # An endless sampler (grain is slow to start and restore on it): the first
    # shard, with an extra index, and the last, without.
    for index in range(count) if epochs else (0, count - 1):
        kw = dict(sampler=sampler, n=n, shard=(index, count), drop=drop, epochs=epochs, shuffle=shuffle, ops=ops)
        lg, ll = _loader(reference, **kw), _loader(grainlike, **kw)
        ig, il = iter(lg), iter(ll)
        full = take(ig, limit)
        assert take(il, limit) == full, f"shard {index}"
        if len(full) < limit:
            assert il.get_state() == ig.get_state(), f"shard {index}: state at the end"
        # grain takes seconds to restore a state of an endless sampler: one step there.
        steps = {0, 1, len(full) // 2, len(full)} if epochs else {len(full) // 2}
        for k in sorted(steps):
            ig, il = iter(lg), iter(ll)
            assert take(ig, k) == take(il, k) == full[:k]
            sg, sl = ig.get_state(), il.get_state()
            assert sl == sg, f"shard {index}, step {k}"
            rest = full[k:]
            il2 = iter(ll)
            il2.set_state(sg)
            assert take(il2, len(rest)) == rest
            ig2 = iter(lg)
            ig2.set_state(sl)
            assert take(ig2, len(rest)) == rest


@pytest.mark.timeout(300)
def test_workers_match_grain(grain_main):
    # Shard 0 of 3 over 11 records has 4 positions: worker 0 of 2 reads 2, worker
    # 1 reads 2; shard 2 has 3 (one worker reads 1). Starting grain's workers
    # dominates: one reference iterator per shard.
    for index in (0, 2):
        kw = dict(sampler="index", n=11, shard=(index, 3), drop=False, shuffle=True, ops=["map", "rand"], workers=2)
        ig = iter(_loader(grain_main, **kw))
        head = take(ig, 2)
        state = ig.get_state()
        rest = take(ig, 100)
        end_state = ig.get_state()
        ll = _loader(grainlike, **kw)
        with iter(ll) as il:
            assert take(il, 2) == head
            assert il.get_state() == state
            assert take(il, 100) == rest
            assert il.get_state() == end_state
        with iter(ll) as il:
            il.set_state(state)
            assert take(il, 100) == rest
        assert json.loads(end_state)["worker_count"] == 2
