"""full_reference_data / full_data_mapper: every record once, fed by callbacks, inside jit."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import grainlike as grain
from grainlike.jax.full_data import full_data_mapper, full_reference_data
from tests.helpers.jaxprs import held_array_sizes

pytestmark = pytest.mark.timeout(120)


def sum_potentials(exp, data, mask, unused_state):
    return jnp.sum(mask * jnp.power(data["base"], exp)), unused_state


def test_jaxsgmc_documented_example_in_a_scan():
    full = full_reference_data({"base": np.arange(10)}, cache_size=3, batch_size=4)

    def body_fun(data_state, exp):
        data_state, (batch_sums, unused) = full.map(partial(sum_potentials, exp), data_state, None,
                                                   masking=True)
        return data_state, (jnp.sum(batch_sums), unused)

    _, (result, _) = jax.lax.scan(body_fun, full.init(), jnp.arange(3))
    assert result.tolist() == [10, 45, 285]
    mapper_fn, release = full_data_mapper({"base": np.arange(10)}, cache_size=3, batch_size=4)
    results, _ = mapper_fn(partial(sum_potentials, 2), None, masking=True)
    assert int(jnp.sum(results)) == 285
    release()


@pytest.mark.parametrize("n, batch_size, cache_size", [(10, 4, 3), (12, 4, 3), (7, 7, 1), (23, 5, 2)])
def test_every_record_is_seen_exactly_once(n, batch_size, cache_size):
    full = full_reference_data({"i": np.arange(n)}, cache_size=cache_size, batch_size=batch_size)

    def count(batch, mask, seen):
        return mask.sum(), seen.at[batch["i"]].add(mask.astype(jnp.int32))

    _, (per_batch, seen) = jax.jit(lambda s: full.map(count, s, jnp.zeros(n, jnp.int32), masking=True))(full.init())
    assert seen.tolist() == [1] * n
    assert per_batch.shape == (-(-n // batch_size),) and int(per_batch.sum()) == n
    # Without masking: one result per record, padding dropped, in record order.
    _, (per_record, _) = jax.jit(lambda s: full.map(lambda b, c: (b["i"] * 2, c), s, None))(full.init())
    assert per_record.tolist() == [2 * i for i in range(n)]


def test_the_program_holds_no_data():
    n, batch_size = 20_000, 100
    full = full_reference_data({"x": np.arange(n, dtype=np.float32)}, cache_size=4, batch_size=batch_size)

    def mean(params, state):
        state, (sums, _) = full.map(lambda b, m, c: (jnp.sum(m * b["x"] * params), c), state, None,
                                    masking=True)
        return jnp.sum(sums) / n, state

    jaxpr = jax.make_jaxpr(lambda p, s: jax.lax.scan(lambda c, _: (c, mean(p, c)[0]), s, None, length=2))(
        jnp.float32(1), full.init())
    assert max(held_array_sizes(jaxpr) + [0]) <= batch_size
    value, _ = jax.jit(mean)(jnp.float32(2), full.init())
    assert float(value) == pytest.approx(2 * (n - 1) / 2)


def test_information_passes_the_mask_and_count():
    full = full_reference_data({"x": np.arange(5)}, cache_size=2, batch_size=2)

    def fn(batch_and_info, carry):
        batch, info = batch_and_info
        return info.mask, carry + info.observation_count

    _, (masks, total) = full.map(fn, full.init(), 0, information=True)
    assert masks.tolist() == [True] * 5 and int(total) == 5 * 3


@pytest.mark.parametrize("worker_count", [0, 2])
def test_operations_and_workers_keep_exactly_once(worker_count, no_leaks):
    class Square(grain.MapTransform):
        def map(self, r):
            return {"i": r["i"], "sq": r["i"] * r["i"]}

    full = full_reference_data({"i": np.arange(11)}, cache_size=2, batch_size=3,
                               operations=[Square()], worker_count=worker_count)
    _, (out, _) = full.map(lambda b, c: ((b["i"], b["sq"]), c), full.init(), None)
    full.release()
    assert sorted(zip(out[0].tolist(), out[1].tolist())) == [(i, i * i) for i in range(11)]


def test_a_padded_dataloader_is_accepted_and_others_are_not():
    loader = grain.DataLoader(data_source=list(range(5)),
                              sampler=grain.IndexSampler(5, grain.NoSharding(), num_epochs=1),
                              operations=[grain.Batch(2, pad=True)])
    full = full_reference_data(loader, cache_size=2)
    _, (out, _) = full.map(lambda b, c: (b * 10, c), full.init(), None)
    assert out.tolist() == [0, 10, 20, 30, 40]
    bad = grain.DataLoader(data_source=list(range(5)),
                           sampler=grain.IndexSampler(5, grain.NoSharding(), num_epochs=1),
                           operations=[grain.Batch(2)])
    with pytest.raises(ValueError, match="Batch\\(..., pad=True\\)"):
        full_reference_data(bad)
