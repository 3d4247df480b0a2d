"""InJitIterator: batches drawn inside jax.jit / lax.scan through an ordered io_callback."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import grainlike as grain
from grainlike.jax.batch_specs import element_spec
from grainlike.jax.in_jit_iterator import InJitIterator

# Every test fails if a grainlike host callback raises (tests/helpers/callbacks.py).
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("callbacks_never_raise")]


def make_loader(worker_count=0, num_epochs=None, num_records=20):
    class Features(grain.MapTransform):
        def map(self, x):
            return {"x": np.int32(x), "v": np.full((2,), x, np.float32)}

    return grain.DataLoader(
        data_source=list(range(num_records)),
        sampler=grain.IndexSampler(num_records, grain.NoSharding(), shuffle=True,
                                   num_epochs=num_epochs, seed=2),
        operations=[Features(), grain.Batch(3)],
        worker_count=worker_count,
    )


def plain_run(worker_count, n):
    """The first n batches' x, and the state after each, iterating normally."""
    with iter(make_loader(worker_count)) as it:
        xs, states = [], []
        for _ in range(n):
            xs.append(next(it)["x"].tolist())
            states.append(it.get_state())
    return xs, states


def step(carry, batch):
    return carry + batch["x"].sum() + batch["v"].sum().astype(jnp.int32), batch["x"]


@pytest.mark.parametrize("worker_count, prefetch", [(0, 0), (0, 2), (2, 1)])
def test_scan_draws_the_loader_batches_in_order(worker_count, prefetch, no_leaks):
    expected, states = plain_run(worker_count, 12)
    with InJitIterator(iter(make_loader(worker_count)), batches_per_call=4,
                       prefetch=prefetch) as feed:
        train = jax.jit(lambda c: feed.scan(step, c, num_steps=8))
        carry, xs = train(jnp.int32(0))
        assert xs.tolist() == expected[:8]
        assert int(carry) == 3 * sum(map(sum, expected[:8]))
        assert feed.get_state() == states[7]
        _, xs = train(carry)  # the same compiled function draws on
        assert xs.tolist()[:4] == expected[8:12]


def test_one_host_visit_per_draw():
    with InJitIterator(iter(make_loader()), batches_per_call=5) as feed:
        calls = []
        host_draw = feed._host_draw

        def counted():
            calls.append(1)
            return host_draw()

        feed._host_draw = counted
        jax.block_until_ready(jax.jit(lambda c: feed.scan(step, c, num_steps=20))(jnp.int32(0)))
        assert len(calls) == 4


@pytest.mark.parametrize("prefetch", [0, 2])
def test_restore_after_a_jitted_run_continues_identically(prefetch):
    expected, _ = plain_run(0, 12)
    with InJitIterator(iter(make_loader()), batches_per_call=2, prefetch=prefetch) as feed:
        train = jax.jit(lambda c: feed.scan(step, c, num_steps=4))
        carry, _ = train(jnp.int32(0))
        jax.block_until_ready(carry)
        state = feed.get_state()
        train(carry)  # runs ahead
        feed.set_state(state)
        _, xs = train(carry)
        assert xs.tolist() == expected[4:8]
    # A fresh loader iterator restored from it continues there too.
    with iter(make_loader()) as it:
        it.set_state(state)
        assert next(it)["x"].tolist() == expected[4]


def test_draw_eagerly_and_with_a_given_spec():
    loader = make_loader()
    with InJitIterator(iter(loader), batches_per_call=3, spec=element_spec(loader)) as feed:
        stack = feed.draw()
        assert stack["x"].shape == (3, 3) and stack["v"].shape == (3, 3, 2)
        assert stack["x"].tolist() == plain_run(0, 3)[0]


def test_end_of_data_raises_on_the_host_and_keeps_the_delivered_position():
    # 20 records, batches of 3: 7 batches; draws of 2 end inside the 4th draw.
    with InJitIterator(iter(make_loader(num_epochs=1)), batches_per_call=2, prefetch=0) as feed:
        draw = jax.jit(lambda: feed.draw(with_ok=True))
        for _ in range(3):
            _, ok = jax.block_until_ready(draw())
            assert bool(ok)
        state = feed.get_state()
        # The callback does not raise (on GPUs that would poison the process): the
        # jitted call returns zeros and ok=False, and the feed's next host call raises.
        stack, ok = jax.block_until_ready(draw())
        assert not bool(ok) and stack["x"].tolist() == [[0, 0, 0]] * 2
        with pytest.raises(EOFError, match="ended after 1 of the 2 batches"):
            feed.get_state()
        assert feed.get_state() == state


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="batches_per_call"):
        InJitIterator(iter([]), batches_per_call=0)
    with pytest.raises(ValueError, match="prefetch"):
        InJitIterator(iter([]), prefetch=-1)
    feed = InJitIterator(iter(make_loader()), batches_per_call=4)
    with pytest.raises(ValueError, match="multiple of batches_per_call=4"):
        feed.scan(step, jnp.int32(0), num_steps=6)
    feed.close()


def test_string_leaves_are_rejected():
    class Named(grain.MapTransform):
        def map(self, x):
            return {"name": f"r{x}"}

    loader = grain.DataLoader(data_source=list(range(4)),
                              sampler=grain.SequentialSampler(4, grain.NoSharding()),
                              operations=[Named(), grain.Batch(2)])
    with InJitIterator(iter(loader), batches_per_call=1, prefetch=0) as feed:
        # Names the key and the fix where the data is read (JaxSGMC's exclude_keys).
        with pytest.raises(TypeError, match=r"numeric leaves only.*\['name'\].*exclude_keys=\['name'\]"):
            feed.draw()


def test_draw_without_an_explicit_batches_per_call_is_an_error_not_a_skip():
    with InJitIterator(iter(make_loader())) as feed:
        with pytest.raises(ValueError, match="pass batches_per_call=k explicitly"):
            jax.jit(lambda: feed.draw()[0])()
        # scan still works with the default of 8 batches per host visit.
        _, xs = jax.jit(lambda c: feed.scan(step, c, num_steps=16))(jnp.int32(0))
        assert xs.tolist() == plain_run(0, 16)[0]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_next_takes_one_batch_per_call_and_skips_none(prefetch):
    expected, states = plain_run(0, 12)
    with InJitIterator(iter(make_loader()), prefetch=prefetch) as feed:
        def body(c, _):
            batch = feed.next()
            return c + batch["x"].sum(), batch["x"]

        run = jax.jit(lambda c: jax.lax.scan(body, c, None, length=5))
        total, xs = run(jnp.int32(0))
        assert xs.tolist() == expected[:5]
        jax.block_until_ready(total)
        assert feed.get_state() == states[4]
        single = jax.jit(lambda: feed.next()["x"])
        assert [single().tolist() for _ in range(7)] == expected[5:12]
        with pytest.raises(ValueError, match="serves next"):
            feed.scan(step, jnp.int32(0), num_steps=8)


def test_end_of_data_is_a_plain_eoferror_within_host_errors():
    with InJitIterator(iter(make_loader(num_epochs=1, num_records=21)), prefetch=0) as feed:
        take = jax.jit(lambda: feed.next()["x"])
        got = [take().tolist() for _ in range(7)]  # 21 records in batches of 3
        assert sorted(sum(got, [])) == list(range(21))
        with pytest.raises(EOFError, match="the wrapped iterator has ended"):
            with grain.host_errors():
                jax.block_until_ready(take())


def test_a_short_final_batch_is_named_within_host_errors():
    with InJitIterator(iter(make_loader(num_epochs=1)), prefetch=0) as feed:  # 20 = 6 * 3 + 2
        take = jax.jit(lambda: feed.next()["x"])
        for _ in range(6):
            take()
        with pytest.raises(ValueError, match=r"shape \(2, 2\) where the compiled program expects \(3, 2\)"):
            with grain.host_errors():
                jax.block_until_ready(take())


@pytest.mark.parametrize("prefetch", [0, 2])
def test_invalid_state_changes_nothing(prefetch):
    expected, states = plain_run(0, 6)
    wrong = states[1].replace(b"seed=2", b"seed=99")
    assert wrong != states[1]
    with InJitIterator(iter(make_loader()), prefetch=prefetch) as feed:
        single = jax.jit(lambda: feed.next()["x"])
        assert single().tolist() == expected[0]
        with pytest.raises(grain.InvalidStateError, match="Sampler in checkpoint"):
            feed.set_state(wrong)
        assert feed.get_state() == states[0]
        assert [single().tolist() for _ in range(5)] == expected[1:6]
