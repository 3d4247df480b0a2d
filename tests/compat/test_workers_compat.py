"""grainlike with worker processes against grain 0.2.18 with the same worker count.

Identical outputs in identical order (with Batch and Filter, sharded and not),
identical state JSON, and cross-restore in both directions.
"""

import json

import pytest

import grainlike
from tests.helpers.pipelines import build, take

CASES = [
    # (workers, shard, ops, epochs, drop_remainder)
    (1, None, ["map", "rand", "batch"], 2, False),
    (2, (1, 2, False), ["map", "filter", "batch"], 2, False),
    (3, None, ["map", "rand", "filter", "batch"], 1, True),
    (2, None, ["map", "rand2"], 1, False),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CASES, ids=[f"W{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_workers_match_reference(grain_ref, case):
    workers, shard, ops, epochs, drop = case
    n = 29
    kw = dict(num_records=n, num_epochs=epochs, shuffle=True, seed=13, shard=shard, ops=ops,
              drop_remainder=drop, batch_size=3, worker_count=workers)
    lg = build(grain_ref, list(range(n)), **kw)
    # One reference iterator serves as both the full run and the k-step state:
    # starting grain's workers dominates this test's time.
    with iter(build(grainlike, list(range(n)), warm_start=False, **kw)) as il:
        k = len(take(il, 1000)) // 2 + 1
    ig = iter(lg)
    head_g = take(ig, k)
    sg = ig.get_state()
    rest_g = take(ig, 1000)
    end_state_g = ig.get_state()  # after exhaustion

    # Without warm start (the default) the workers compute everything; with it
    # this small pipeline is mostly computed in process while they start.
    for warm_start in (False, True):
        ll = build(grainlike, list(range(n)), warm_start=warm_start, **kw)
        il = iter(ll)
        assert take(il, 1000) == head_g + rest_g
        assert il.get_state() == end_state_g
        il.close()

        il = iter(ll)
        assert take(il, k) == head_g
        sl = il.get_state()
        assert json.loads(sl) == json.loads(sg)
        assert sl == sg
        il.close()
        il2 = iter(ll)
        il2.set_state(sg)
        assert take(il2, 1000) == rest_g
        il2.close()
    ig2 = iter(lg)
    ig2.set_state(sl)
    assert take(ig2, 1000) == rest_g
