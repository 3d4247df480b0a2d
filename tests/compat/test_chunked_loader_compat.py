"""The DataLoader's chunked path against grain 0.2.18: many chunks of records.

Maps and filters followed by a Batch, read in process, run on chunks of up to 256
records (grainlike/loader/chunked.py). Over a source several chunks long, every
batch, random draw and ``get_state()`` after every batch must equal grain's, and a
state from either library restores in the other.
"""

import json

import pytest

import grainlike
from tests.helpers.pipelines import build, take

N = 700


def _state_positions(state: bytes) -> dict:
    return json.loads(state)["last_seen_indices"]


@pytest.mark.parametrize(
    "ops, batch_size, drop_remainder, epochs",
    [
        (["map", "batch"], 128, False, 1),
        (["map", "filter", "rand", "batch"], 9, False, 2),
        (["map", "rand", "rand2", "filter", "batch"], 50, True, 1),
        (["map", "filter", "batch", "rand"], 7, False, 1),  # draws from each batch's rng
    ],
)
def test_every_batch_and_state_match_grain(grain_ref, ops, batch_size, drop_remainder, epochs):
    kw = dict(num_records=N, num_epochs=epochs, shuffle=True, seed=13, shard=None, ops=ops,
              batch_size=batch_size, drop_remainder=drop_remainder)
    lg = build(grain_ref, grain_ref.RangeDataSource(0, N, 1), **kw)
    ll = build(grainlike, grainlike.RangeDataSource(0, N, 1), **kw)
    ig, il = iter(lg), iter(ll)
    outputs, states = [], []
    while True:
        g, l = take(ig, 1), take(il, 1)
        assert l == g
        sg, sl = ig.get_state(), il.get_state()
        assert sl == sg, f"after batch {len(outputs)}: {_state_positions(sl)} != {_state_positions(sg)}"
        if not g:
            break
        outputs.append(g[0])
        states.append(sg)
    assert _state_positions(states[-1])["0"] > 2 * 256  # several chunks
    for k in (1, len(outputs) // 3, len(outputs) - 1):
        rest = outputs[k:]
        il2 = iter(ll)
        il2.set_state(states[k - 1])  # grain's state in grainlike
        assert take(il2, len(rest) + 1) == rest
        ig2 = iter(lg)
        ig2.set_state(il.get_state() if k == len(outputs) else states[k - 1])
        assert take(ig2, len(rest) + 1) == rest
