"""from_source(...)...build(): the same DataLoader as the explicit constructor."""

from __future__ import annotations

import numpy as np
import pytest

import grainlike as grain
from grainlike.builder import LoaderBuilder, from_source
from grainlike.core.sampling import RandomSampler

pytestmark = pytest.mark.timeout(60)

N = 30


def run(loader, stop_at=4):
    """All outputs, and the state after output ``stop_at``."""
    with iter(loader) as it:
        out, state = [], None
        for i, b in enumerate(it):
            out.append({k: v.tolist() for k, v in b.items()})
            if i + 1 == stop_at:
                state = it.get_state()
    return out, state


@pytest.mark.parametrize("worker_count", [0, 2])
def test_builder_matches_the_explicit_constructor(worker_count, no_leaks):
    class Square(grain.MapTransform):
        def map(self, x):
            return {"x": np.int64(x), "sq": np.int64(x * x)}

    class Noise(grain.RandomMapTransform):
        def random_map(self, x, rng):
            return {**x, "noise": rng.integers(0, 1000)}

    class Odd(grain.FilterTransform):
        def filter(self, x):
            return x["x"] % 2 == 1

    explicit = grain.DataLoader(
        data_source=list(range(N)),
        sampler=grain.IndexSampler(N, grain.NoSharding(), shuffle=True, num_epochs=2, seed=3),
        operations=[Square(), Noise(), Odd(), grain.Batch(4)],
        worker_count=worker_count,
        worker_buffer_size=2 if worker_count else 1,
    )
    built = (
        from_source(list(range(N)))
        .shuffle(3)
        .map(lambda x: {"x": np.int64(x), "sq": np.int64(x * x)})
        .random_map(lambda x, rng: {**x, "noise": rng.integers(0, 1000)})
        .filter(lambda x: x["x"] % 2 == 1)
        .batch(4)
        .epochs(2)
        .workers(worker_count)
        .prefetch(4)  # 2 workers: 2 batches each
        .build()
    )
    assert repr(built.sampler) == repr(explicit.sampler)
    assert built.multiprocessing_options == explicit.multiprocessing_options
    out_e, state_e = run(explicit)
    out_b, state_b = run(built)
    assert out_b == out_e
    assert state_b == state_e
    # Checkpoints cross between the two.
    with iter(explicit) as it:
        it.set_state(state_b)
        assert [{k: v.tolist() for k, v in b.items()} for b in it] == out_e[4:]


def test_builder_accepts_transform_objects_too():
    class Double(grain.MapTransform):
        def map(self, x):
            return x * 2

    loader = from_source(list(range(6))).map(Double()).batch(4, pad=True).build()
    batches = list(loader)
    assert batches[-1]["data"].tolist() == [8, 10, 0, 0]
    assert batches[-1]["mask"].tolist() == [True, True, False, False]


def test_builder_is_immutable():
    base = from_source(list(range(6)))
    doubled = base.map(lambda x: x * 2)
    assert base.operations == () and len(doubled.operations) == 1
    assert [int(x) for x in base.build()] == list(range(6))
    assert [int(x) for x in doubled] == [0, 2, 4, 6, 8, 10]


def test_builder_defaults_to_one_unshuffled_epoch():
    b = from_source(list(range(3)))
    assert isinstance(b, LoaderBuilder)
    assert b.build().sampler.num_epochs == 1 and not b.build().sampler.shuffle
    assert len(list(b.epochs(3).build())) == 9


def test_builder_with_another_sampler():
    sampler = RandomSampler(10, num_samples=7, seed=0)
    loader = from_source(list(range(10))).sampler(sampler).build()
    assert [int(x) for x in loader] == sampler.locate(np.arange(7)).keys.tolist()


def test_errors_name_the_user_function():
    def explode(x):
        raise KeyError("boom")

    loader = from_source(list(range(3))).map(explode).build()
    with pytest.raises(KeyError) as info:
        list(loader)
    assert any("explode" in note for note in getattr(info.value, "__notes__", []))


def test_bad_arguments_are_rejected():
    b = from_source(list(range(3)))
    with pytest.raises(ValueError, match=r"\.seed\(s\) or \.shuffle\(s\)"):
        b.random_map(lambda x, rng: x).build()
    with pytest.raises(TypeError, match="pass an instance"):
        b.map(grain.MapTransform)
    with pytest.raises(TypeError, match="not a Map"):
        b.map(grain.Batch(2))
    with pytest.raises(TypeError, match="or a function"):
        b.filter(3)
    with pytest.raises(ValueError, match="workers must be"):
        b.workers(-1)
    with pytest.raises(ValueError, match="epochs must be"):
        b.epochs(0)


def test_grainlike_loader_is_callable_and_still_a_package():
    import json

    import grainlike
    import grainlike.loader.data_loader  # noqa: F401  (submodules still import)

    explicit = grainlike.from_source(list(range(10))).shuffle(3).batch(4).build()
    called = grainlike.loader(list(range(10))).shuffle(3).batch(4).build()
    assert [b.tolist() for b in called] == [b.tolist() for b in explicit]
    it1, it2 = iter(called), iter(explicit)
    next(it1), next(it2)
    assert json.loads(it1.get_state()) == json.loads(it2.get_state())


class CountingSource:
    """Records 0..n-1; remembers how many reads happened."""

    def __init__(self, n):
        self.n = n
        self.reads = 0

    def __len__(self):
        return self.n

    def __getitem__(self, k):
        self.reads += 1
        return np.int64(k)

    def __repr__(self):
        return f"CountingSource({self.n})"


def test_prefetch_without_workers_reads_ahead_in_a_thread_and_keeps_states_exact(no_leaks):
    from tests.helpers.leaks import wait_until

    source = CountingSource(40)
    loader = from_source(source).shuffle(1).batch(4).prefetch(3).build()
    plain = from_source(CountingSource(40)).shuffle(1).batch(4).build()
    with iter(plain) as it:
        want = [next(it).tolist(), next(it).tolist()]
        want_state = it.get_state()
        want += [b.tolist() for b in it]
    with iter(loader) as it:
        got = [next(it).tolist(), next(it).tolist()]
        # 2 batches delivered, 3 more read ahead (and one more may be in flight).
        assert wait_until(lambda: source.reads >= 5 * 4)
        assert it.get_state() == want_state  # what was delivered, not what was read
        it.set_state(want_state)
        rest = [b.tolist() for b in it]
    assert got + rest == want


def test_prefetch_iterator_that_refuses_a_state_stays_where_it_was(no_leaks):
    from tests.helpers.leaks import wait_until

    source = CountingSource(40)
    loader = from_source(source).batch(4).prefetch(3).build()
    other = iter(from_source(CountingSource(40)).shuffle(7).batch(4).build())
    with iter(loader) as it:
        assert next(it).tolist() == [0, 1, 2, 3]
        assert wait_until(lambda: source.reads >= 4 * 4)  # batches read ahead
        with pytest.raises(grain.InvalidStateError):
            it.set_state(other.get_state())  # another sampler's state
        assert next(it).tolist() == [4, 5, 6, 7]  # the next batch delivered, not the next read
    other.close()


def test_prefetch_with_workers_sets_the_per_worker_buffer():
    assert from_source(list(range(8))).workers(2).prefetch(5).build() \
        .multiprocessing_options.per_worker_buffer_size == 3
    with pytest.raises(ValueError, match="prefetch must be a positive int"):
        from_source(list(range(8))).prefetch(0)


def loadax_batches(workers, global_order):
    loader = (from_source(list(range(10))).map(lambda x: x * 2)
              .batch(2, global_order=global_order).workers(workers).build())
    return [b.tolist() for b in loader]


@pytest.mark.parametrize("workers", [2, 3])
def test_global_order_batches_do_not_depend_on_the_worker_count(workers, no_leaks):
    expected = [[0, 2], [4, 6], [8, 10], [12, 14], [16, 18]]
    assert loadax_batches(0, False) == expected
    assert loadax_batches(workers, True) == expected
    # The default batches inside each worker (grain's DataLoader), so contents differ.
    assert loadax_batches(workers, False) != expected


def test_global_order_checkpoints_restore_mid_run(no_leaks):
    loader = from_source(list(range(23))).shuffle(0).batch(4, pad=True, global_order=True).workers(2).build()
    out, state = run(loader, stop_at=3)
    plain = from_source(list(range(23))).shuffle(0).batch(4, pad=True).build()
    assert out == run(plain)[0]
    assert len(loader) == 6
    with iter(loader) as it:
        it.set_state(state)
        assert [{k: v.tolist() for k, v in b.items()} for b in it] == out[3:]


def test_global_order_refuses_a_sampler_that_pads_its_epochs():
    sampler = grain.PaddedEpochSampler(10, 4, worker_count=2, num_epochs=1)
    builder = from_source(list(range(10))).sampler(sampler).batch(4, pad=True, global_order=True).workers(2)
    with pytest.raises(ValueError, match="cannot mask the padding of PaddedEpochSampler"):
        builder.build()


def test_global_order_needs_the_batch_last():
    with pytest.raises(ValueError, match="one Batch, as the last operation"):
        from_source(list(range(4))).batch(2, global_order=True).map(lambda b: b).workers(2).build()
