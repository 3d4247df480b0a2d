"""evaluate: every record exactly once, in fixed-size masked batches, reduced."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import grainlike as grain
from grainlike.jax.evaluation import evaluate
from tests.helpers.jaxprs import held_array_sizes

# Every test fails if a grainlike host callback raises (tests/helpers/callbacks.py).
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("callbacks_never_raise")]

N = 23  # not a multiple of any batch size used here


def features():
    class Features(grain.MapTransform):
        def map(self, x):
            return {"x": np.float32(x), "label": np.int32(x % 3)}

    return Features()


@pytest.mark.parametrize("worker_count", [0, 2])
def test_concat_sees_every_record_exactly_once_in_record_order(worker_count, no_leaks):
    out = evaluate(lambda b: {"x": b["x"], "label": b["label"]}, list(range(N)), [features()],
                   batch_size=5, reduce="concat", worker_count=worker_count)
    assert out["x"].tolist() == list(range(N))
    assert out["label"].tolist() == [i % 3 for i in range(N)]


@pytest.mark.parametrize("worker_count", [0, 2])
def test_mean_accuracy_matches_numpy(worker_count, no_leaks):
    def correct(batch):
        prediction = (batch["x"].astype(jnp.int32) * 2) % 3  # right when x % 3 == 0
        return prediction == batch["label"]

    accuracy = evaluate(correct, list(range(N)), [features()], batch_size=4,
                        worker_count=worker_count)
    assert accuracy == pytest.approx(np.mean([(2 * i) % 3 == i % 3 for i in range(N)]))


def test_sum_ignores_padding_rows():
    # Padding rows are zeros: fn(0) = 1 would count them if the mask were ignored.
    total = evaluate(lambda b: b["x"] + 1.0, list(range(N)), [features()], batch_size=10,
                     reduce="sum")
    assert total == pytest.approx(sum(range(N)) + N)


def test_fn_is_compiled_once():
    traces = []

    def fn(batch):
        traces.append(1)
        return batch["x"]

    evaluate(fn, list(range(N)), [features()], batch_size=4, reduce="sum")
    assert len(traces) == 1


def test_callable_reduce_gets_the_per_record_results():
    out = evaluate(lambda b: b["x"], list(range(N)), [features()], batch_size=6,
                   reduce=lambda xs: int(xs.max()))
    assert out == N - 1


def test_random_transforms_use_the_seed():
    class Noise(grain.RandomMapTransform):
        def random_map(self, x, rng):
            return np.float32(rng.random())

    a = evaluate(lambda b: b, list(range(N)), [Noise()], batch_size=4, reduce="concat", seed=1)
    b = evaluate(lambda b: b, list(range(N)), [Noise()], batch_size=4, reduce="concat", seed=1)
    c = evaluate(lambda b: b, list(range(N)), [Noise()], batch_size=4, reduce="concat", seed=2)
    assert a.tolist() == b.tolist() != c.tolist()


def test_shards_together_cover_every_record_once():
    parts = [
        evaluate(lambda b: b["x"], list(range(N)), [features()], batch_size=4, reduce="concat",
                 shard_options=grain.ShardOptions(i, 3))
        for i in range(3)
    ]
    assert sorted(np.concatenate(parts).tolist()) == list(range(N))


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="evaluate batches by itself"):
        evaluate(lambda b: b, list(range(N)), [grain.Batch(4)], batch_size=4)
    with pytest.raises(ValueError, match="reduce must be"):
        evaluate(lambda b: b, list(range(N)), batch_size=4, reduce="max")
    with pytest.raises(ValueError, match="batch_size must be"):
        evaluate(lambda b: b, list(range(N)), batch_size=0)
    with pytest.raises(ValueError, match="leading axis"):
        evaluate(lambda b: b.sum(), list(range(N)), batch_size=4)


@pytest.mark.parametrize("worker_count", [0, 2])
def test_inside_a_scan_every_reduction_works_without_data_in_the_program(worker_count, no_leaks):
    import jax

    def body(carry, w):
        mean = evaluate(lambda b: b["x"] * w, list(range(N)), [features()], batch_size=5,
                        worker_count=worker_count)
        total = evaluate(lambda b: b["x"] * w, list(range(N)), [features()], batch_size=5, reduce="sum")
        concat = evaluate(lambda b: b["x"] * w, list(range(N)), [features()], batch_size=5,
                          reduce="concat", worker_count=worker_count)
        biggest = evaluate(lambda b: b["x"] * w, list(range(N)), [features()], batch_size=5,
                           reduce=lambda xs: xs.max())
        return carry, (mean, total, concat, biggest)

    run = jax.jit(lambda: jax.lax.scan(body, 0, jnp.arange(3.0)))
    _, (mean, total, concat, biggest) = run()
    xs = np.arange(N, dtype=np.float32)
    assert mean.tolist() == pytest.approx([0, xs.mean(), 2 * xs.mean()])
    assert total.tolist() == pytest.approx([0, xs.sum(), 2 * xs.sum()])
    assert concat.tolist() == [(xs * w).tolist() for w in range(3)]
    assert biggest.tolist() == [0, N - 1, 2 * (N - 1)]
    program = jax.make_jaxpr(lambda: jax.lax.scan(body, 0, jnp.arange(3.0)))()
    sizes = [size for size in held_array_sizes(program) if size > 1]  # scalars are the program's own literals
    # No array beyond one batch (5), and not every record's batch baked in either.
    assert max(sizes, default=0) <= 5 and sum(sizes) < N
