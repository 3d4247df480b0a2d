"""reference_data: batches in jit / scan / while_loop from a device cache, JaxSGMC's modes."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import grainlike as grain
from grainlike.jax.host_callbacks import host_errors
from grainlike.jax.jit_batches import ArraysSource
from grainlike.jax.reference_data import reference_data

pytestmark = pytest.mark.timeout(120)

N = 10


def source():
    return {"x": np.arange(N, dtype=np.int32), "y": np.zeros((N, 2), np.float32)}


def draw(data, state, steps):
    """``steps`` batches' x and masks via lax.scan in one jitted call; the final state."""

    def body(s, _):
        s, batch, info = data.next(s)
        return s, (batch["x"], info.mask)

    state, (xs, masks) = jax.jit(lambda s: jax.lax.scan(body, s, None, length=steps))(state)
    return state, np.asarray(xs), np.asarray(masks)


def expected(loader, steps):
    """The first ``steps`` batches the DataLoader itself yields: x and masks."""
    xs, masks = [], []
    with iter(loader) as it:
        for _ in range(steps):
            b = next(it)
            xs.append(b["x"])
            masks.append(b["mask"] if "mask" in b else np.ones(len(b["x"]), bool))
    return np.stack(xs), np.stack(masks)


@pytest.mark.parametrize("mode, sampler", [
    ({}, lambda: grain.RandomSampler(N, num_samples=None, seed=5)),
    ({"shuffle": True}, lambda: grain.IndexSampler(N, grain.NoSharding(), shuffle=True, num_epochs=None, seed=5)),
    ({"shuffle": True, "in_epochs": True},
     lambda: grain.PaddedEpochSampler(N, 3, shuffle=True, num_epochs=None, seed=5)),
])
@pytest.mark.parametrize("records", [False, True], ids=["arrays", "records"])
def test_every_mode_draws_its_sampler_batches_in_order_without_skipping(mode, sampler, records):
    # Arrays are gathered with numpy; a list of records goes through a DataLoader.
    arrays = source()
    data_source = [{k: v[i] for k, v in arrays.items()} for i in range(N)] if records else arrays
    data = reference_data(data_source, cache_size=4, batch_size=3, seed=5)
    pad = mode.get("in_epochs", False)
    loader = grain.DataLoader(data_source=ArraysSource(arrays),
                              sampler=sampler(), operations=[grain.Batch(3, pad=pad)],
                              shard_options=grain.NoSharding())
    want_x, want_mask = expected(loader, 11)
    state = data.init(**mode)
    state, xs, masks = draw(data, state, 7)         # 7 is not a multiple of the cache size
    state, xs2, masks2 = draw(data, state, 4)
    assert np.concatenate([xs, xs2]).tolist() == want_x.tolist()
    assert np.concatenate([masks, masks2]).tolist() == want_mask.tolist()
    data.release()


def test_with_replacement_repeats_records_and_shuffle_covers_each_epoch():
    data = reference_data(source(), cache_size=5, batch_size=5)
    _, xs, _ = draw(data, data.init(), 10)
    assert len(xs.ravel()) > len(set(xs.ravel().tolist()))  # 50 draws of 10 records repeat
    _, xs, _ = draw(data, data.init(shuffle=True), 4)
    epochs = xs.reshape(2, N)
    assert [sorted(e) for e in epochs.tolist()] == [list(range(N))] * 2
    assert epochs[0].tolist() != epochs[1].tolist()  # reshuffled per epoch


def test_in_epochs_masks_the_padding_and_reports_the_observation_count():
    data = reference_data(source(), cache_size=2, batch_size=3)
    state = data.init(shuffle=True, in_epochs=True)
    for _ in range(4):
        state, batch, info = jax.jit(data.next)(state)
    # 10 records in batches of 3: the 4th batch holds one real record.
    assert info.mask.tolist() == [True, False, False]
    assert batch["x"].tolist()[1:] == [0, 0]
    assert int(info.observation_count) == N and int(info.batch_size) == 3


def test_one_host_visit_per_cache_fill():
    data = reference_data(source(), cache_size=4, batch_size=2)
    calls = []
    fill = data._host_fill

    def counted(*args):
        calls.append(1)
        return fill(*args)

    data._host_fill = counted
    draw(data, data.init(shuffle=True), 16)
    assert len(calls) == 3  # init filled the first 4 batches on the host


def test_while_loop_draws_and_chains_are_independent():
    data = reference_data(source(), cache_size=3, batch_size=2)
    a, b = data.init(shuffle=True, seed=1), data.init(shuffle=True, seed=1)
    other = data.init(shuffle=True, seed=2)

    def total(state, steps):
        def body(c):
            s, i, acc = c
            s, batch, _ = data.next(s)
            return s, i + 1, acc + jnp.sum(batch["x"] * (i + 1))

        return jax.jit(lambda s: jax.lax.while_loop(lambda c: c[1] < steps, body, (s, 0, 0)))(state)

    _, _, ta = total(a, 7)
    _, xs_b, _ = draw(data, b, 7)
    assert int(ta) == int(sum((i + 1) * xs_b[i].sum() for i in range(7)))
    _, xs_other, _ = draw(data, other, 7)
    assert xs_other.tolist() != xs_b.tolist()


@pytest.mark.parametrize("steps", [1, 5, 6])
def test_a_restored_chain_draws_the_same_batches(steps):
    data = reference_data(source(), cache_size=3, batch_size=4)
    state = data.init(shuffle=True, in_epochs=True, seed=3)
    state, _, _ = draw(data, state, steps)
    checkpoint = json.loads(json.dumps(data.get_state(state)))  # JSON-able
    _, after, after_masks = draw(data, state, 8)
    fresh = reference_data(source(), cache_size=3, batch_size=4)
    restored = fresh.restore(checkpoint)
    _, again, again_masks = draw(fresh, restored, 8)
    assert again.tolist() == after.tolist() and again_masks.tolist() == after_masks.tolist()


def test_reusing_an_old_state_replays_its_batches():
    data = reference_data(source(), cache_size=2, batch_size=3)
    state = data.init(shuffle=True)
    _, first, _ = draw(data, state, 5)
    _, again, _ = draw(data, state, 5)   # functional: the same state, the same batches
    assert again.tolist() == first.tolist()


@pytest.mark.parametrize("worker_count", [0, 2])
def test_a_dataloader_feeds_chains_as_it_is(worker_count, no_leaks):
    loader = grain.DataLoader(
        data_source=list(range(20)),
        sampler=grain.IndexSampler(20, grain.NoSharding(), shuffle=True, num_epochs=None, seed=0),
        operations=[grain.Batch(4)],
        worker_count=worker_count,
    )
    want = [b.tolist() for b in expected_plain(loader, 9)]
    with reference_data(loader, cache_size=4) as data:
        state = data.init()

        def body(s, _):
            s, batch, _ = data.next(s)
            return s, batch

        _, xs = jax.jit(lambda s: jax.lax.scan(body, s, None, length=9))(state)
        assert xs.tolist() == want


def expected_plain(loader, steps):
    with iter(loader) as it:
        return [next(it) for _ in range(steps)]


def test_end_of_data_reaches_the_user_as_eoferror():
    loader = grain.DataLoader(
        data_source=list(range(10)),
        sampler=grain.IndexSampler(10, grain.NoSharding(), num_epochs=1),
        operations=[grain.Batch(4)],
    )
    data = reference_data(loader, cache_size=2)
    state = data.init()

    def body(s, _):
        s, batch, _ = data.next(s)
        return s, batch

    run = jax.jit(lambda s: jax.lax.scan(body, s, None, length=3))
    _, xs = run(state)  # 3 batches: 4 + 4 + 2 records, the last zero-padded... none skipped
    assert xs[:2].ravel().tolist() == list(range(8)) and xs[2].tolist()[:2] == [8, 9]
    with pytest.raises(EOFError, match="no more batches"):
        with host_errors():
            jax.block_until_ready(jax.jit(lambda s: jax.lax.scan(body, s, None, length=4))(state))


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="batch_size=20 is larger"):
        reference_data(source(), batch_size=20)
    with pytest.raises(ValueError, match="cache_size must be a positive int"):
        reference_data(source(), cache_size=0, batch_size=2)
    data = reference_data(source(), batch_size=2)
    with pytest.raises(ValueError, match=r"in_epochs=True\) needs shuffle=True"):
        data.init(in_epochs=True)
    with pytest.raises(ValueError, match="checkpoint is the dict"):
        data.restore({"line": 0})


def test_host_errors_leaves_other_errors_alone():
    # Raised here rather than by a callback of the test's own: on a GPU that would
    # poison every later computation of the test process.
    with pytest.raises(jax.errors.JaxRuntimeError, match="not grainlike's"):
        with host_errors():
            raise jax.errors.JaxRuntimeError("INTERNAL: CpuCallback error: KeyError: not grainlike's")
    with pytest.raises(ZeroDivisionError):
        with host_errors():
            1 / 0


def test_dropped_reference_data_ends_its_read_ahead_threads():
    import gc
    import threading

    def fills():
        return [t for t in threading.enumerate() if t.name.startswith("grainlike-reference-data-fill")]

    before = set(fills())
    data = reference_data(source(), cache_size=2, batch_size=2)
    draw(data, data.init(shuffle=True), 3)  # a fill is read ahead, never taken
    assert set(fills()) - before
    del data
    gc.collect()
    for t in set(fills()) - before:
        t.join(10)
    assert not set(fills()) - before
