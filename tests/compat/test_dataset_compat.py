"""grainlike's Dataset API against grain 0.2.18: elements, order, states, restores."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from grainlike.dataset.conformance import assert_equal_output_after_checkpoint
from tests.compat.dataset_pairs import GRAINLIKE, assert_same, check_pipeline, grain_namespace


@pytest.fixture(scope="module")
def G(grain_ref):
    return grain_namespace(grain_ref)


def _records(n=23):
    return [{"x": np.arange(3, dtype=np.int32) + i, "y": float(i)} for i in range(n)]


PIPELINES = {
    "range": lambda lib: lib.MapDataset.range(2, 30, 3),
    "range_stop_only": lambda lib: lib.MapDataset.range(7),
    "source_list": lambda lib: lib.MapDataset.source(list("abcdefghij")),
    "map_lambda": lambda lib: lib.MapDataset.range(17).map(lambda x: x * x),
    "map_iter": lambda lib: lib.MapDataset.range(17).to_iter_dataset().map(lambda x: (x, -x)),
    "filter_map": lambda lib: lib.MapDataset.range(30).filter(lambda x: x % 3 == 1),
    "filter_iter": lambda lib: lib.MapDataset.range(30).to_iter_dataset().filter(lambda x: x % 4),
    "filter_allow_nones": lambda lib: lib.MapDataset.range(9)
    .filter(lambda x: x % 2)
    .to_iter_dataset(allow_nones=True),
    "slice": lambda lib: lib.MapDataset.range(40)[3:31:4],
    "shard_1_of_3": lambda lib: lib.MapDataset.source(list(range(20)))[1::3],
    "slice_of_slice": lambda lib: lib.MapDataset.range(50).slice(slice(5, None))[::-3],
    "batch_map": lambda lib: lib.MapDataset.source(_records()).batch(4),
    "batch_map_drop": lambda lib: lib.MapDataset.range(23).batch(5, drop_remainder=True),
    "batch_iter": lambda lib: lib.MapDataset.source(_records()).to_iter_dataset().batch(6),
    "batch_iter_drop": lambda lib: lib.MapDataset.range(23)
    .to_iter_dataset()
    .filter(lambda x: x != 4)
    .batch(5, drop_remainder=True),
    "batch_fn": lambda lib: lib.MapDataset.range(10).batch(3, batch_fn=lambda xs: tuple(xs)),
    "map_with_index_map": lambda lib: lib.MapDataset.source(list("abcdef"))[::-1].map_with_index(
        lambda i, x: f"{x}{i}"
    ),
    "map_with_index_iter": lambda lib: lib.MapDataset.range(30)
    .to_iter_dataset()
    .filter(lambda x: x % 3)
    .map_with_index(lambda i, x: i * 100 + x),
    "threads": lambda lib: lib.MapDataset.source(list(range(57)))
    .map(lambda x: x + 1)
    .to_iter_dataset(lib.ReadOptions(num_threads=3, prefetch_buffer_size=7)),
    "threads_filtered": lambda lib: lib.MapDataset.source(list(range(57)))
    .filter(lambda x: x % 5 == 0)
    .to_iter_dataset(lib.ReadOptions(num_threads=2, prefetch_buffer_size=4)),
    "default_read_options_source": lambda lib: lib.MapDataset.source(list(range(31))).map(str),
    "shuffle": lambda lib: lib.MapDataset.range(37).shuffle(seed=5),
    "shuffle_seed_max": lambda lib: lib.MapDataset.source(list(range(11))).shuffle(seed=2**32 - 1).repeat(3),
    "shuffle_from_ds_seed": lambda lib: lib.MapDataset.range(25).seed(42).shuffle(),
    "shuffle_repeat_epochs": lambda lib: lib.MapDataset.range(9).shuffle(seed=1).repeat(4),
    "repeat_infinite_limited": lambda lib: lib.MapDataset.range(7).seed(3).shuffle().repeat()[:40],
    "repeat_then_shuffle": lambda lib: lib.MapDataset.range(6).repeat(3).shuffle(seed=9),
    "repeat_no_reseed": lambda lib: lib.MapDataset.range(8)
    .shuffle(seed=4)
    .random_map(_draw, seed=11)
    .repeat(3, reseed_each_epoch=False),
    "random_map_seeded": lambda lib: lib.MapDataset.range(20).random_map(_draw, seed=123),
    "random_map_default_seed": lambda lib: lib.MapDataset.range(20).seed(8).random_map(_draw),
    "random_map_two_default_seeds": lambda lib: lib.MapDataset.range(12)
    .seed(8)
    .shuffle()
    .random_map(_draw)
    .random_map(lambda t, rng: t + (rng.random(),)),
    "random_map_reseeded_epochs": lambda lib: lib.MapDataset.range(5).random_map(_draw, seed=2).repeat(3),
    "random_map_after_filter": lambda lib: lib.MapDataset.range(20)
    .filter(lambda x: x % 3)
    .random_map(_draw, seed=6),
    "random_map_iter": lambda lib: lib.MapDataset.range(15)
    .to_iter_dataset()
    .filter(lambda x: x % 4)
    .random_map(_draw, seed=77),
    "random_map_iter_default_seed": lambda lib: lib.MapDataset.range(15)
    .seed(1)
    .shuffle()
    .to_iter_dataset()
    .seed(99)
    .random_map(_draw),
    "seed_two_branches": lambda lib: lib.MapDataset.range(10)
    .seed(5)
    .map(lambda x: x)
    .seed(6)
    .shuffle()
    .random_map(_draw),
    "shard_of_shuffled_repeat": lambda lib: lib.MapDataset.range(13).shuffle(seed=0).repeat(2)[2::3],
    "mix_uniform": lambda lib: lib.MapDataset.mix([lib.MapDataset.range(5), lib.MapDataset.range(100, 108)]),
    "mix_weights": lambda lib: lib.MapDataset.mix(
        [
            lib.MapDataset.range(30).shuffle(seed=1),
            lib.MapDataset.source(list("abcdefghij")),
            lib.MapDataset.range(-20, 0),
        ],
        weights=[0.5, 0.2, 0.3],
    ),
    "mix_repeated_limited": lambda lib: lib.MapDataset.mix(
        [lib.MapDataset.range(3).repeat(), lib.MapDataset.range(10, 12).repeat()], [3, 1]
    )[:30],
    "mix_then_shuffle_batch": lambda lib: lib.MapDataset.mix(
        [lib.MapDataset.range(9), lib.MapDataset.range(50, 59)], [1, 2]
    )
    .seed(3)
    .shuffle()
    .batch(4),
    "concatenate": lambda lib: lib.MapDataset.concatenate(
        [lib.MapDataset.range(3), lib.MapDataset.source(["x", "y"]), lib.MapDataset.range(40, 45)]
    ),
    "concatenate_epochs": lambda lib: lib.MapDataset.concatenate(
        [lib.MapDataset.range(3).shuffle(seed=2), lib.MapDataset.range(10, 14).shuffle(seed=3)]
    ).repeat(3),
    "select_from_datasets": lambda lib: lib.MapDataset.select_from_datasets(
        [lib.MapDataset.range(10), lib.MapDataset.source(list("pqrst"))], _alternate(lib)
    ),
    "iter_mix": lambda lib: lib.IterDataset.mix(
        [lib.MapDataset.range(6).to_iter_dataset(), lib.MapDataset.range(100, 110).to_iter_dataset()]
    ),
    "iter_mix_weights": lambda lib: lib.IterDataset.mix(
        (
            lib.MapDataset.range(20).to_iter_dataset().filter(lambda x: x % 2),
            lib.MapDataset.range(100, 130).to_iter_dataset(),
            lib.MapDataset.source(list("abcdefghijkl")).to_iter_dataset(),
        ),
        [0.2, 0.5, 0.3],
    ),
    "random_map_threads": lambda lib: lib.MapDataset.source(list(range(80)))
    .random_map(_draw, seed=31)
    .to_iter_dataset(lib.ReadOptions(num_threads=4, prefetch_buffer_size=9)),
    "source_of_dataset": lambda lib: lib.MapDataset.source(lib.MapDataset.range(12).map(lambda x: x * 2)).shuffle(
        seed=3
    ),
    "limit": lambda lib: lib.LimitIterDataset(lib.MapDataset.range(30).shuffle(seed=4).to_iter_dataset(), 11),
    "limit_beyond_end": lambda lib: lib.LimitIterDataset(lib.MapDataset.range(5).to_iter_dataset(), 9),
    "repeat_iter": lambda lib: lib.RepeatIterDataset(
        lib.MapDataset.range(7).to_iter_dataset().random_map(_draw, seed=3), num_epochs=3
    ),
    "repeat_iter_forever_limited": lambda lib: lib.LimitIterDataset(
        lib.RepeatIterDataset(lib.MapDataset.range(4).to_iter_dataset().batch(3)), 10
    ),
    "window_shuffle_map": lambda lib: lib.WindowShuffleMapDataset(lib.MapDataset.range(23), window_size=5, seed=7),
    "window_shuffle_iter": lambda lib: lib.WindowShuffleIterDataset(
        lib.MapDataset.range(23).to_iter_dataset().filter(lambda x: x % 4), window_size=6, seed=2**32 - 10
    ),
    "zip_map": lambda lib: lib.ZipMapDataset(
        [lib.MapDataset.range(9), lib.MapDataset.source(list("abcdefghi")).shuffle(seed=1)]
    ),
    "zip_iter": lambda lib: lib.ZipIterDataset(
        [lib.MapDataset.range(9).to_iter_dataset(), lib.MapDataset.range(20, 40).to_iter_dataset()], strict=False
    ),
    "batch_and_pad": lambda lib: lib.MapDataset.range(11)
    .to_iter_dataset()
    .batch(4, batch_fn=functools.partial(lib.batch_and_pad, batch_size=4, pad_value=-1)),
    "thread_prefetch": lambda lib: lib.ThreadPrefetchIterDataset(
        lib.MapDataset.range(25).to_iter_dataset().random_map(_draw, seed=4).batch(3), prefetch_buffer_size=3
    ),
    "thread_prefetch_unbuffered": lambda lib: lib.ThreadPrefetchIterDataset(
        lib.MapDataset.range(9).to_iter_dataset().map_with_index(lambda i, x: (i, x)), prefetch_buffer_size=0
    ),
    "flatmap_map": lambda lib: lib.FlatMapMapDataset(lib.MapDataset.range(9).shuffle(seed=2), _splitter(lib)),
    "flatmap_map_apply": lambda lib: lib.MapDataset.range(5).apply([_splitter(lib)]).to_iter_dataset().batch(2),
    "flatmap_iter": lambda lib: lib.FlatMapIterDataset(
        lib.MapDataset.range(9).to_iter_dataset().filter(lambda x: x != 4), _splitter(lib)
    ).batch(2),
    "iter_mix_mapping": lambda lib: lib.IterDataset.mix(
        {"zeta": lib.MapDataset.range(8).to_iter_dataset(), "alpha": lib.MapDataset.range(50, 70).to_iter_dataset()},
        {"zeta": 1.0, "alpha": 3.0},
    ),
}


def _splitter(lib, fan_out=3):
    class Split(lib.FlatMap):
        max_fan_out = fan_out

        def flat_map(self, x):
            return [f"{x}:{k}" for k in range(x % 4)]

    return Split()


def _alternate(lib):
    class Alternate(lib.DatasetSelectionMap):
        def __len__(self):
            return 9

        def __getitem__(self, index):
            return (index % 2, (index // 2) * 3)

    return Alternate()


def _draw(x, rng):
    return (x, rng.integers(1000), float(rng.random()))


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_pipeline_matches_grain(G, name):
    assert check_pipeline(PIPELINES[name], G)


def _classes(lib):
    class AddTen(lib.Map):
        def map(self, x):
            return x + 10

    class Odd(lib.Filter):
        def filter(self, x):
            return x % 2 == 1

    class Tag(lib.MapWithIndex):
        def map_with_index(self, i, x):
            return (i, x)

    return AddTen(), Odd(), Tag()


@pytest.mark.parametrize("kind", ["map", "iter"])
def test_transform_classes_and_apply_match_grain(G, kind):
    def build(lib):
        add, odd, tag = _classes(lib)
        ds = lib.MapDataset.range(20).map(add).map_with_index(tag)
        if kind == "iter":
            ds = ds.to_iter_dataset().map(lambda t: t[1]).filter(odd)
            return ds.apply([add, lib.Batch(3, drop_remainder=False)])
        return ds.map(lambda t: t[1]).apply([add, lib.Batch(4, drop_remainder=True)])

    check_pipeline(build, G)


def test_getitem_matches_grain(G):
    for lib_ds in (G, GRAINLIKE):
        pass
    g = G.MapDataset.range(5)
    l = GRAINLIKE.MapDataset.range(5)
    for i in (0, 4, 5, 7, 123, -1, -6):
        assert_same(g[i], l[i], f"range[{i}]")
    gs = G.MapDataset.source([10, 11, 12]).map(lambda x: x * 2)
    ls = GRAINLIKE.MapDataset.source([10, 11, 12]).map(lambda x: x * 2)
    for i in (0, 2, 3, 10, -1):
        assert_same(gs[i], ls[i], f"source[{i}]")
    gf = G.MapDataset.range(6).filter(lambda x: x > 2)
    lf = GRAINLIKE.MapDataset.range(6).filter(lambda x: x > 2)
    assert [gf[i] for i in range(8)] == [lf[i] for i in range(8)]
    assert_same(G.MapDataset.range(7).batch(3)[2], GRAINLIKE.MapDataset.range(7).batch(3)[2])
    assert_same(G.MapDataset.range(7).batch(3)[4], GRAINLIKE.MapDataset.range(7).batch(3)[4])
    gsl, lsl = G.MapDataset.range(10)[2:8:2], GRAINLIKE.MapDataset.range(10)[2:8:2]
    assert len(gsl) == len(lsl) == 3
    assert [gsl[i] for i in range(7)] == [lsl[i] for i in range(7)]
    assert isinstance(lsl, GRAINLIKE.MapDataset)


def test_lengths_match_grain(G):
    def lengths(lib):
        r = lib.MapDataset.range
        return [
            len(r(10)),
            len(r(3, 10, 2)),
            len(r(10, 3, -2)),
            len(r(10)[1::3]),
            len(r(10)[-4:]),
            len(r(10).batch(3)),
            len(r(10).batch(3, drop_remainder=True)),
            len(r(10).filter(lambda x: x)),
            len(r(10).repeat()),
            len(r(0).repeat()),
            len(r(10).repeat(3)),
            len(r(10).shuffle(seed=1).repeat(2)[5:]),
        ]

    assert lengths(G) == lengths(GRAINLIKE)


def _errors(lib):
    """Each case: a zero-argument function expected to raise."""
    r = lib.MapDataset.range

    def closed_next():
        it = iter(r(3).to_iter_dataset())
        it.close()
        next(it)

    def state_out_of_range():
        it = iter(r(3).to_iter_dataset())
        it.set_state({"next_index": 4})

    def user_error():
        list(r(3).map(lambda x: {}[x]))

    def user_error_iter():
        list(r(3).to_iter_dataset().map(lambda x: [][x]))

    return {
        "batch_size_zero": lambda: r(3).batch(0),
        "batch_size_zero_iter": lambda: r(3).to_iter_dataset().batch(0),
        "batch_after_filter": lambda: r(3).filter(bool).map(str).batch(2),
        "slice_not_slice": lambda: r(3).slice(2),
        "apply_unknown": lambda: r(3).apply([object()]),
        "closed_next": closed_next,
        "state_out_of_range": state_out_of_range,
        "user_error": user_error,
        "user_error_iter": user_error_iter,
        "empty_range_getitem": lambda: r(0)[0],
        "shuffle_no_seed": lambda: r(3).shuffle(),
        "shuffle_negative_seed": lambda: r(3).shuffle(seed=-1),
        "shuffle_seed_too_big": lambda: r(3).shuffle(seed=2**32),
        "random_map_no_seed": lambda: r(3).random_map(lambda x, rng: x),
        "random_map_iter_no_seed": lambda: r(3).to_iter_dataset().random_map(lambda x, rng: x),
        "repeat_zero": lambda: r(3).repeat(0),
        "repeat_infinite": lambda: r(3).repeat().repeat(2),
        "empty_shuffle_getitem": lambda: r(0).shuffle(seed=1)[0],
        "mix_zero_weight": lambda: lib.MapDataset.mix([r(3), r(4)], [1, 0]),
        "mix_empty_dataset": lambda: lib.MapDataset.mix([r(3), r(0)]),
        "mix_weight_count": lambda: lib.MapDataset.mix([r(3), r(4)], [1, 2, 3]),
        "iter_mix_zero_weight": lambda: lib.IterDataset.mix([r(3).to_iter_dataset()], [0]),
        "concatenate_infinite": lambda: lib.MapDataset.concatenate([r(3), r(2).repeat()]),
        "empty_concatenate_getitem": lambda: lib.MapDataset.concatenate([r(0)])[0],
        "limit_zero": lambda: lib.LimitIterDataset(r(3).to_iter_dataset(), 0),
        "repeat_iter_zero": lambda: lib.RepeatIterDataset(r(3).to_iter_dataset(), 0),
        "zip_map_lengths": lambda: lib.ZipMapDataset([r(3), r(4)]),
        "zip_map_empty": lambda: lib.ZipMapDataset([]),
        "zip_iter_empty": lambda: lib.ZipIterDataset([]),
        "zip_iter_shorter": lambda: list(lib.ZipIterDataset([r(3).to_iter_dataset(), r(2).to_iter_dataset()])),
        "zip_iter_longer": lambda: list(lib.ZipIterDataset([r(2).to_iter_dataset(), r(3).to_iter_dataset()])),
        "batch_and_pad_too_many": lambda: lib.batch_and_pad([1, 2, 3], batch_size=2),
        "batch_and_pad_none": lambda: lib.batch_and_pad([], batch_size=2),
        "flatmap_fan_out_exceeded": lambda: list(lib.FlatMapMapDataset(r(9), _splitter(lib, fan_out=2))),
        "batch_after_flatmap": lambda: lib.FlatMapMapDataset(r(9), _splitter(lib)).batch(2),
        "thread_prefetch_negative": lambda: lib.ThreadPrefetchIterDataset(r(3).to_iter_dataset(), prefetch_buffer_size=-1),
        "thread_prefetch_user_error": lambda: list(
            lib.ThreadPrefetchIterDataset(r(3).to_iter_dataset().map(lambda x: {}[x]), prefetch_buffer_size=2)
        ),
    }


def test_errors_have_grain_types(G):
    grain_cases, ours = _errors(G), _errors(GRAINLIKE)
    for name, case in grain_cases.items():
        with pytest.raises(Exception) as expected:
            case()
        with pytest.raises(expected.type):
            ours[name]()


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_restores_at_every_step(name):
    assert_equal_output_after_checkpoint(PIPELINES[name](GRAINLIKE))


def test_next_index_matches_grain(G):
    def build(lib):
        return lib.MapDataset.range(20).map(lambda x: x + 1).to_iter_dataset().map_with_index(
            lambda i, x: (i, x)
        ).batch(3)

    out = {}
    for lib in (G, GRAINLIKE):
        it = iter(build(lib))
        seen = [lib.get_next_index(it)]
        next(it)
        seen.append(lib.get_next_index(it))
        lib.set_next_index(it, 4)
        seen.append(lib.get_next_index(it))
        seen.append(next(it))
        seen.append(it.get_state())
        out[lib.name] = seen
    assert_same(out["grain"], out["grainlike"])


def test_random_map_in_a_worker_offsets_its_counter_like_grain(G, grain_ref):
    from grain._src.python.dataset import base as grain_base

    from grainlike.dataset.base import MultiprocessingContext

    def build(lib):
        return lib.MapDataset.range(10).to_iter_dataset().random_map(_draw, seed=5)

    g_it, l_it = iter(build(G)), iter(build(GRAINLIKE))
    g_it._ctx.mp_context = grain_base.MultiprocessingContext(process_index=1, process_count=3)
    l_it._ctx.mp_context = MultiprocessingContext(process_index=1, process_count=3)
    assert_same([next(g_it) for _ in range(6)], [next(l_it) for _ in range(6)])


def test_mix_mapping_restores_components_by_name(G):
    def build(lib, names):
        return lib.IterDataset.mix({n: lib.MapDataset.range(i * 100, i * 100 + 20).to_iter_dataset() for i, n in enumerate(names)})

    results = {}
    for lib in (G, GRAINLIKE):
        it = iter(build(lib, ["a", "b"]))
        for _ in range(7):
            next(it)
        state = it.get_state()
        grown = iter(build(lib, ["a", "b", "c"]))
        grown.set_state(state)
        results[lib.name] = (state, [next(grown) for _ in range(9)], grown.get_state())
    assert_same(results["grain"], results["grainlike"])
    # States cross over too.
    it = iter(build(GRAINLIKE, ["a", "b", "c"]))
    it.set_state(results["grain"][0])
    assert_same(results["grain"][1], [next(it) for _ in range(9)])


def test_grains_transform_objects_work_in_grainlike_pipelines(G):
    add, odd, tag = _classes(G)
    ours = GRAINLIKE.MapDataset.range(10).map(add).filter(odd).map_with_index(tag)
    theirs = G.MapDataset.range(10).map(add).filter(odd).map_with_index(tag)
    assert_same(list(theirs), list(ours))


def _count_until_error(ds):
    it, n = iter(ds), 0
    try:
        for _ in it:
            n += 1
    except ValueError as e:
        return n, it.get_state(), "skipped" in str(e)
    return n, it.get_state(), None


@pytest.mark.parametrize("where", ["iter_filter", "map_filter"])
def test_filter_raise_threshold_matches_grain(G, where):
    def build(lib, raise_at=0.5, warn_at=None):
        ds = lib.MapDataset.range(2500)
        keep = lambda x: x % 5 < 2  # noqa: E731 - drops 60 %
        ds = ds.to_iter_dataset().filter(keep) if where == "iter_filter" else ds.filter(keep).to_iter_dataset()
        options = lib.DatasetOptions(filter_raise_threshold_ratio=raise_at, filter_warn_threshold_ratio=warn_at)
        return lib.WithOptionsIterDataset(ds.map(lambda x: x * 2), options)

    ours = _count_until_error(build(GRAINLIKE))
    assert ours == _count_until_error(build(G))
    assert ours[2] is True and ours[0] == 400  # raised at the end of the first window
    assert _count_until_error(build(GRAINLIKE, raise_at=0.7)) == _count_until_error(build(G, raise_at=0.7))


def test_dataset_options_merge_like_grain(G):
    def merged(lib):
        a = lib.DatasetOptions(filter_warn_threshold_ratio=0.6, min_shm_size=10)
        b = lib.DatasetOptions(filter_warn_threshold_ratio=None, filter_raise_threshold_ratio=0.8)
        out = []
        for m in (a.merge(b), b.merge(a), a.merge(None), lib.DatasetOptions().merge(b)):
            out.append((m.filter_warn_threshold_ratio, m.filter_raise_threshold_ratio, m.min_shm_size))
        return out

    assert merged(G) == merged(GRAINLIKE)
