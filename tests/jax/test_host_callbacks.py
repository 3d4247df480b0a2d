"""No error ever leaves a grainlike host callback; the host raises it after the jitted call.

On GPUs an exception raised inside an ordered ``io_callback`` poisons every later
synchronisation of the process. grainlike's callbacks report failure as data
(``ok=False``, zeros) and keep the exception, which the host raises afterwards as
itself. Every test in this folder runs under ``callbacks_never_raise``
(tests/jax/conftest.py), which fails a test whose grainlike callback raised or
returned arrays other than the declared ones; here each kind of failure (the end
of the data, a failing transform, a batch of another shape, a closed or released
feed, a full collector, a checkpoint that cannot be made) is driven through every
feed, and each test checks the exception the host gets, that the process stays
usable, and that no batch is skipped or repeated.
"""

from __future__ import annotations

import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import grainlike as grain
from grainlike import io
from grainlike.core.errors import ClosedIteratorError
from grainlike.jax.evaluation import evaluate
from grainlike.jax.full_data import full_reference_data
from grainlike.jax.host_callbacks import host_errors
from grainlike.jax.in_jit_iterator import InJitIterator
from grainlike.jax.reference_data import reference_data

pytestmark = pytest.mark.timeout(120)


class Boom(Exception):
    """A user transform's own exception type."""


class FailsAt(grain.MapTransform):
    """Raises Boom for record ``bad`` the first ``times`` times it is read; counts its calls."""

    def __init__(self, bad: int, times: int = 1):
        self.bad, self.times, self.calls = bad, times, []

    def map(self, x):
        x = int(x["i"]) if isinstance(x, dict) else int(x)
        self.calls.append(x)
        if x == self.bad and self.times > 0:
            self.times -= 1
            raise Boom(f"record {x} is bad")
        return {"i": np.int32(x)}


def loader(n=12, batch=2, operations=None, num_epochs=None):
    """Batches ``{"i": [2k, 2k + 1]}`` of records 0..n-1 in order."""
    return grain.DataLoader(
        data_source=list(range(n)),
        sampler=grain.IndexSampler(n, grain.NoSharding(), shuffle=False, num_epochs=num_epochs),
        operations=(operations or [FailsAt(-1)]) + [grain.Batch(batch)],
    )


def assert_process_usable():
    """A new jitted computation with an ordered io_callback of its own, and a new feed, work."""
    from jax.experimental import io_callback

    twice = jax.jit(lambda x: io_callback(lambda v: np.asarray(v) * 2, jax.ShapeDtypeStruct((3,), jnp.int32),
                                          x, ordered=True) + 1)
    assert twice(jnp.arange(3, dtype=jnp.int32)).tolist() == [1, 3, 5]
    with InJitIterator(iter(loader()), prefetch=0) as feed:
        take = jax.jit(lambda: feed.next()["i"])
        assert [take().tolist() for _ in range(2)] == [[0, 1], [2, 3]]
    jax.effects_barrier()


# -- every kind of failure, through every feed ---------------------------------------------
#
# A case builds a feed and returns (run, host_call, exception type, message): run()
# is the user's jitted computation whose callback fails; host_call() is the feed's
# next host call, which raises the pending exception when host_errors did not.


def in_jit_end_of_data():
    feed = InJitIterator(iter(loader(n=4, num_epochs=1)), prefetch=0)
    run = jax.jit(lambda: jax.lax.scan(lambda c, _: (c, feed.next()["i"]), 0, None, length=3)[1])
    return run, feed.get_state, EOFError, "the wrapped iterator has ended"


def in_jit_failing_transform():
    feed = InJitIterator(iter(loader(operations=[FailsAt(5)])), batches_per_call=2, prefetch=1)
    run = jax.jit(lambda: feed.scan(lambda c, b: (c + b["i"].sum(), b["i"]), 0, num_steps=4))
    return run, feed.get_state, Boom, "record 5 is bad"


def in_jit_batch_of_another_shape():
    feed = InJitIterator(iter(loader(n=5, batch=2, num_epochs=1)), prefetch=0)  # 2, 2, then 1
    run = jax.jit(lambda: jax.lax.scan(lambda c, _: (c, feed.next()["i"]), 0, None, length=3)[1])
    return run, feed.get_state, ValueError, r"shape \(1,\) where the compiled program expects \(2,\)"


def in_jit_closed_feed():
    feed = InJitIterator(iter(loader()), batches_per_call=1, prefetch=0)
    draw = jax.jit(lambda: feed.draw())
    jax.block_until_ready(draw())
    feed.close()
    # Also a RuntimeError, which a closed InJitIterator raised before ClosedIteratorError.
    return draw, feed.get_state, ClosedIteratorError, "InJitIterator is closed"


def reference_data_end_of_data():
    data = reference_data(loader(n=6, batch=2, num_epochs=1), cache_size=2)
    state = data.init()
    run = jax.jit(lambda s: jax.lax.scan(lambda s, _: (data.next(s)[0], None), s, None, length=4)[0])
    return lambda: run(state), lambda: data.get_state(state), EOFError, "chain 0 has no more batches"


def reference_data_failing_transform():
    # init() reads records 0-3 (fill 0) and, ahead, 4-7; record 9 is in fill 2.
    data = reference_data(loader(operations=[FailsAt(9)]), cache_size=2)
    state = data.init()
    run = jax.jit(lambda s: jax.lax.scan(lambda s, _: (data.next(s)[0], None), s, None, length=8)[0])
    return lambda: run(state), lambda: data.init(), Boom, "record 9 is bad"


def reference_data_released_chain():
    data = reference_data({"x": np.arange(10)}, cache_size=2, batch_size=2)
    state = data.init()
    data.release(state)
    run = jax.jit(lambda s: jax.lax.scan(lambda s, _: (data.next(s)[0], None), s, None, length=3)[0])
    return lambda: run(state), lambda: data.init(), ValueError, r"no chain 0 \(it was released\)"


def full_data_failing_transform():
    full = full_reference_data([{"i": i} for i in range(10)], cache_size=2, batch_size=2, operations=[FailsAt(7)])
    state = full.init()
    run = jax.jit(lambda s: full.map(lambda b, c: (b["i"], c), s, None))
    return lambda: run(state), full.init, Boom, "record 7 is bad"


def evaluate_failing_transform():
    # Tracing reads the first fill (16 batches, records 0-31) to learn the shapes.
    fails = FailsAt(35)
    run = jax.jit(lambda: evaluate(lambda b: b["i"], list(range(40)), [fails], batch_size=2, reduce="sum"))
    return run, None, Boom, "record 35 is bad"


def collector_full():
    init_save, save, postprocess_save = io.save(io.MemoryCollector())
    state = init_save({"i": jnp.int32(0)}, None, 2)
    run = jax.jit(lambda s: jax.lax.scan(lambda s, i: save(s, True, {"i": i}), s, jnp.arange(4))[0])
    return lambda: run(state), lambda: postprocess_save(state), IndexError, "more than the samples_collected=2"


def checkpoint_of_a_released_chain(tmp_path):
    data = reference_data({"x": np.arange(10)}, cache_size=8, batch_size=2)
    init_save, save, postprocess_save = io.save(io.MemoryCollector(), checkpoint_every=2,
                                               checkpoint_dir=str(tmp_path), data=data)
    chain = data.init()
    data.release(chain)  # no refill is needed, but the checkpoint asks where the chain is

    def body(c, _):
        d, s = c
        d, batch, _ = data.next(d)
        s, _ = save(s, True, {"x": batch["x"]}, data_state=d)
        return (d, s), None

    state = init_save({"x": jnp.zeros(2, jnp.int32)}, None, 4)
    run = jax.jit(lambda c: jax.lax.scan(body, c, None, length=4)[0])
    return lambda: run((chain, state)), lambda: postprocess_save(state), ValueError, "no chain 0"


CASES = [in_jit_end_of_data, in_jit_failing_transform, in_jit_batch_of_another_shape, in_jit_closed_feed,
         reference_data_end_of_data, reference_data_failing_transform, reference_data_released_chain,
         full_data_failing_transform, evaluate_failing_transform, collector_full,
         checkpoint_of_a_released_chain]


def build(case, tmp_path):
    return case(tmp_path) if case is checkpoint_of_a_released_chain else case()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_host_errors_raises_the_original_exception_and_the_process_stays_usable(case, tmp_path,
                                                                                callbacks_never_raise):
    run, host_call, kind, message = build(case, tmp_path)
    with pytest.raises(kind, match=message) as raised:
        with host_errors():
            jax.block_until_ready(run())
    assert type(raised.value) is kind
    assert callbacks_never_raise, "the failure went through a grainlike callback"
    if kind is Boom:  # the traceback reaches into the user's transform
        assert "map" in [frame.name for frame in traceback.extract_tb(raised.value.__traceback__)]
    if host_call is not None:
        host_call()  # raised once, by host_errors: the feed's next host call does not raise it again
    assert_process_usable()


@pytest.mark.parametrize("case", [c for c in CASES if c is not evaluate_failing_transform],
                         ids=lambda c: c.__name__)
def test_without_host_errors_the_feeds_next_host_call_raises_it_once(case, tmp_path):
    run, host_call, kind, message = build(case, tmp_path)
    jax.block_until_ready(run())  # the jitted call itself never raises
    jax.effects_barrier()
    with pytest.raises(kind, match=message):
        host_call()
    assert_process_usable()


def test_host_errors_raises_what_failed_during_the_context_without_blocking_on_results():
    run, host_call, _, _ = in_jit_end_of_data()
    with pytest.raises(EOFError):
        with host_errors():
            run()  # not blocked on: the exit waits for the pending callbacks
    with host_errors():  # raised once: a later context has nothing to raise
        jax.block_until_ready(jnp.zeros(1))
    jax.block_until_ready(run())  # fails again, outside any context: pending
    with host_errors():  # no callback of the feed ran in here
        jax.block_until_ready(jnp.zeros(1))
    with pytest.raises(EOFError):  # its refused callbacks report it again
        with host_errors():
            jax.block_until_ready(run())
    host_call()  # raised by host_errors: not again
    jax.block_until_ready(run())
    with pytest.raises(EOFError):
        host_call()


def test_host_errors_as_a_decorator_and_exceptions_leaving_the_context_pass_unchanged():
    run, _, _, _ = in_jit_end_of_data()

    @host_errors()
    def train():
        return jax.block_until_ready(run())

    with pytest.raises(EOFError, match="has ended"):
        train()
    run, host_call, _, _ = in_jit_failing_transform()
    with pytest.raises(KeyError):
        with host_errors():
            jax.block_until_ready(run())
            raise KeyError("the user's own")
    with pytest.raises(Boom):  # still pending: the feed raises it
        host_call()


# -- no batch skipped or repeated --------------------------------------------------------


def test_after_a_failed_draw_later_draws_read_nothing_and_a_restore_continues_at_the_failed_batch():
    fails = FailsAt(5)
    with InJitIterator(iter(loader(operations=[fails])), prefetch=0) as feed:
        def body(c, _):
            batch, ok = feed.next(with_ok=True)
            return c, (batch["i"], ok)

        _, (xs, oks) = jax.jit(lambda: jax.lax.scan(body, 0, None, length=4))()
        assert oks.tolist() == [True, True, False, False]
        assert xs.tolist() == [[0, 1], [2, 3], [0, 0], [0, 0]]
        assert fails.calls == [0, 1, 2, 3, 4, 5]  # the 4th call read nothing
        with pytest.raises(Boom, match="record 5 is bad"):
            feed.get_state()
        state = feed.get_state()  # after the 2nd batch, the last one delivered
        feed.set_state(state)
        take = jax.jit(lambda: feed.next()["i"])
        assert [take().tolist() for _ in range(2)] == [[4, 5], [6, 7]]


def test_scan_skips_the_steps_of_undelivered_batches_and_the_end_of_data_loses_none():
    # 14 records in batches of 2: 7 batches; draws of 2 end inside the 4th draw.
    with InJitIterator(iter(loader(n=14, num_epochs=1)), batches_per_call=2, prefetch=1) as feed:
        step = lambda c, b: (c + b["i"].sum(), b["i"])  # noqa: E731
        carry, xs, ok = jax.jit(lambda: feed.scan(step, jnp.int32(0), num_steps=10, with_ok=True))()
        assert not bool(ok)
        assert xs.tolist() == [[2 * i, 2 * i + 1] for i in range(6)] + [[0, 0]] * 4
        assert int(carry) == sum(range(12))  # the carry after the 6th batch, not run on zeros
        with pytest.raises(EOFError, match="ended after 1 of the 2 batches"):
            feed.get_state()
        state = feed.get_state()
    with iter(loader(n=14, num_epochs=1)) as it:
        it.set_state(state)
        assert next(it)["i"].tolist() == [12, 13]  # the 7th batch: not skipped


def test_a_reference_data_chain_at_its_end_masks_the_rest_and_saves_its_last_position(callbacks_never_raise):
    data = reference_data(loader(n=6, batch=2, num_epochs=1), cache_size=2)
    state = data.init()

    def body(s, _):
        s, batch, info = data.next(s)
        return s, (batch["i"], info.mask, s.ok)

    visits = len(callbacks_never_raise)
    state, (xs, masks, oks) = jax.jit(lambda s: jax.lax.scan(body, s, None, length=6))(state)
    assert xs.tolist() == [[0, 1], [2, 3], [4, 5], [0, 0], [0, 0], [0, 0]]
    assert masks.tolist() == [[True] * 2] * 3 + [[False] * 2] * 3
    assert oks.tolist() == [True] * 3 + [False] * 3
    assert len(callbacks_never_raise) - visits == 2  # fills 1 and 2; none once ok is False
    with pytest.raises(EOFError, match="no more batches"):
        data.get_state(state)
    checkpoint = data.get_state(state)
    restored = data.restore(checkpoint)  # after the 3rd batch: the next one is the end again
    with pytest.raises(EOFError, match="no more batches"):
        data.next(restored)  # eagerly: raised at once
    data.release()


def test_saves_after_a_full_collector_are_not_counted():
    init_save, save, postprocess_save = io.save(io.MemoryCollector())
    state = init_save({"i": jnp.int32(0)}, None, 2)
    state = jax.jit(lambda s: jax.lax.scan(lambda s, i: save(s, True, {"i": i}), s, jnp.arange(5))[0])(state)
    assert int(state.saved_samples) == 2
    with pytest.raises(IndexError, match="chain 0 got sample 3"):
        postprocess_save(state)
    out = postprocess_save(state)
    assert out["samples"]["i"].tolist() == [0, 1]


# -- called eagerly, a feed raises at once --------------------------------------------------


def test_eager_calls_raise_at_once():
    with InJitIterator(iter(loader(n=2, num_epochs=1)), prefetch=0) as feed:
        assert feed.next()["i"].tolist() == [0, 1]
        with pytest.raises(EOFError, match="has ended"):
            feed.next()
    full = full_reference_data([{"i": i} for i in range(6)], cache_size=2, batch_size=2, operations=[FailsAt(4)])
    with pytest.raises(Boom, match="record 4 is bad"):
        full.map(lambda b, c: (b["i"], c), full.init(), None)
    _, (out, _) = full.map(lambda b, c: (b["i"], c), full.init(), None)  # the transform works now
    assert out.tolist() == list(range(6))
    assert_process_usable()


# -- a cpu backend is needed for host callbacks ----------------------------------------------


def test_without_a_cpu_backend_tracing_names_what_is_needed(monkeypatch):
    from grainlike.jax import host_callbacks

    original = jax.local_devices

    def no_cpu(*args, backend=None, **kwargs):
        if backend == "cpu":
            raise RuntimeError("Unknown backend cpu. Available backends are ['cuda']")
        return original(*args, backend=backend, **kwargs)

    monkeypatch.setattr(host_callbacks, "_CPU_BACKEND", [])
    monkeypatch.setattr(jax, "local_devices", no_cpu)
    with InJitIterator(iter(loader()), batches_per_call=1, prefetch=0) as feed:
        with pytest.raises(RuntimeError, match="set JAX_PLATFORMS=cuda,cpu"):
            jax.jit(lambda: feed.draw())()
        monkeypatch.setattr(jax, "local_devices", original)
        assert jax.jit(lambda: feed.draw())()["i"].tolist() == [[0, 1]]  # nothing was read
