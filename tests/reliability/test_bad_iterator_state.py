"""Malformed states of every iterator type: refused as ``InvalidStateError`` naming a field.

Each iterator is given a real state (what ``get_state()`` wrote after two elements)
with one value replaced by garbage (huge or negative ints, floats, NaN, strings,
bytes, None, lists, dicts), a key dropped, or the whole state replaced. ``set_state``
either refuses it with ``InvalidStateError`` before changing anything (the next
element is the one due before), or accepts it, and then the iterator still works.
The DataLoader's JSON state is fuzzed in test_bad_state.py.
"""

import copy
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import grainlike as grain
import grainlike.experimental as ex
from grainlike import InvalidStateError

N = 40
TAKEN = 2


def _tokens(x):
    return {"a": np.arange(x % 5 + 1)}


class _Twice(grain.experimental.FlatMapTransform):
    max_fan_out = 2

    def flat_map(self, x):
        return [x, x]


def _mp_prefetch(workers):
    return grain.MapDataset.range(N).to_iter_dataset().mp_prefetch(
        grain.MultiprocessingOptions(num_workers=workers)
    )


def _device():
    from grainlike.jax.device_iterator import DeviceIterator

    return DeviceIterator(iter(grain.MapDataset.range(N).batch(2).to_iter_dataset()), prefetch=0)


_ds = grain.MapDataset.range(N)
DATASETS = {
    "map": lambda: _ds.map(lambda x: x + 1).to_iter_dataset(),
    "shuffle": lambda: _ds.shuffle(seed=1).to_iter_dataset(),
    "batch": lambda: _ds.to_iter_dataset().batch(3),
    "filter": lambda: _ds.to_iter_dataset().filter(lambda x: x % 2 == 0),
    "repeat": lambda: ex.RepeatIterDataset(_ds.to_iter_dataset(), num_epochs=2),
    "thread_prefetch": lambda: ex.ThreadPrefetchIterDataset(_ds.to_iter_dataset(), prefetch_buffer_size=2),
    "mix": lambda: grain.IterDataset.mix([_ds.to_iter_dataset(), _ds.to_iter_dataset()], [0.5, 0.5]),
    "interleave": lambda: ex.InterleaveIterDataset(grain.MapDataset.source([_ds, _ds]), cycle_length=2),
    "zip": lambda: ex.ZipIterDataset([_ds.to_iter_dataset(), _ds.to_iter_dataset()]),
    "window_shuffle": lambda: ex.WindowShuffleIterDataset(_ds.to_iter_dataset(), window_size=5, seed=1),
    "first_fit_pack": lambda: ex.FirstFitPackIterDataset(
        _ds.map(_tokens).to_iter_dataset(), length_struct={"a": 8}, num_packing_bins=2
    ),
    "concat_then_split": lambda: ex.ConcatThenSplitIterDataset(
        _ds.map(_tokens).to_iter_dataset(), length_struct={"a": 8}
    ),
    "rebatch": lambda: ex.RebatchIterDataset(_ds.to_iter_dataset().batch(3), batch_size=5),
    "best_fit_pack": lambda: ex.BestFitPackIterDataset(
        _ds.map(_tokens).to_iter_dataset(), length_struct={"a": 8}, num_packing_bins=2
    ),
    "flat_map": lambda: ex.FlatMapIterDataset(_ds.to_iter_dataset(), _Twice()),
    "cache": lambda: ex.CacheIterDataset(_ds.to_iter_dataset()),
    "limit": lambda: ex.LimitIterDataset(_ds.to_iter_dataset(), count=30),
    "map_with_index": lambda: _ds.map_with_index(lambda i, x: (i, x)).to_iter_dataset(),
    "seed_random_map": lambda: _ds.random_map(lambda x, rng: x + rng.integers(3), seed=3).to_iter_dataset(),
    "elastic": lambda: ex.ElasticIterator(_ds, global_batch_size=4, shard_options=grain.NoSharding()),
    "mp_prefetch0": lambda: _mp_prefetch(0),
}


def _same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(_leaves(a), _leaves(b), strict=True))


def _leaves(x):
    if isinstance(x, dict):
        return [leaf for k in sorted(x) for leaf in _leaves(x[k])]
    if isinstance(x, (list, tuple)):
        return [leaf for v in x for leaf in _leaves(v)]
    return [np.asarray(x)]


def _paths(state, prefix=()):
    if isinstance(state, dict):
        for key, value in state.items():
            yield prefix + (key,)
            yield from _paths(value, prefix + (key,))
    elif isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            yield prefix + (i,)
            yield from _paths(value, prefix + (i,))


GARBAGE = (
    st.sampled_from([10**30, -(10**30), 2**63, -1, 1.5, math.nan, math.inf, "7", "", None, b"\x00", True])
    | st.integers()
    | st.lists(st.integers(-3, 3), max_size=3)
    | st.dictionaries(st.text(max_size=3), st.integers() | st.none(), max_size=2)
)


@st.composite
def mutations(draw, state):
    """``state`` with one value replaced, one key dropped or added, or replaced whole."""
    kind = draw(st.integers(0, 3))
    if kind == 3:
        return draw(GARBAGE)
    paths = list(_paths(state))
    if not paths:
        return draw(GARBAGE)
    path = draw(st.sampled_from(paths))
    bad = copy.deepcopy(state)
    holder = bad
    for step in path[:-1]:
        holder = holder[step]
    if isinstance(holder, tuple):
        return draw(GARBAGE)
    if kind == 0:
        holder[path[-1]] = draw(GARBAGE)
    elif kind == 1 and isinstance(holder, dict):
        del holder[path[-1]]
    elif isinstance(holder, dict):
        holder[draw(st.sampled_from(["extra", "", "0"]))] = draw(GARBAGE)
    else:
        holder[path[-1]] = draw(GARBAGE)
    return bad


def _check(make, expected, state, bad):
    """``bad`` is refused naming a field and ``it`` stays where it was, or it is accepted."""
    it = make()
    for _ in range(TAKEN):
        next(it)
    try:
        it.set_state(bad)
    except InvalidStateError as e:
        assert "state" in str(e), f"{type(e).__name__} does not name the field: {e}"
        assert _same(next(it), expected[TAKEN]), f"moved after refusing {bad!r}"
        return
    # Accepted: a state this iterator can write and read back, and keep iterating from.
    again = it.get_state()
    it.set_state(again)
    try:
        next(it)
    except StopIteration:
        pass


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(DATASETS))
def test_malformed_dataset_iterator_states_are_refused_naming_the_field(name):
    # A fresh dataset each time: an ElasticIterator hands out one iterator.
    make = lambda: iter(DATASETS[name]())  # noqa: E731
    expected = [x for _, x in zip(range(TAKEN + 1), make())]
    it = make()
    for _ in range(TAKEN):
        next(it)
    state = it.get_state()

    @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(mutations(state))
    def run(bad):
        _check(make, expected, state, bad)

    run()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bad_value", [10**30, -1, 2**63, "3", None, 1.5, [0], {"x": 0}])
def test_huge_or_wrong_ints_in_a_two_worker_mp_prefetch_state_are_refused_naming_the_field(no_leaks, bad_value):
    # Workers start: one iterator, many states (each refusal must leave it usable).
    dataset = _mp_prefetch(2)
    expected = list(dataset)
    it = iter(dataset)
    try:
        for _ in range(TAKEN):
            next(it)
        state = it.get_state()
        taken = TAKEN
        for key in sorted(state):
            bad = {**state, key: bad_value}
            try:
                it.set_state(bad)
            except InvalidStateError as e:
                assert key in str(e)
                assert next(it) == expected[taken]
                taken += 1
                continue
            raise AssertionError(f"accepted {key}={bad_value!r}")
    finally:
        it.close()


@pytest.mark.timeout(60)
def test_malformed_state_of_a_device_iterator_is_refused_and_the_position_kept():
    pytest.importorskip("jax")
    expected = [np.asarray(b) for b in _device()]
    with _device() as it:
        next(it)
        state = it.get_state()
        for k, bad in enumerate([{"next_index": 10**30}, {"next_index": -1}, {"next_index": "1"}, {}, None, [1]]):
            with pytest.raises(InvalidStateError, match="next_index|state"):
                it.set_state(bad)
            assert np.array_equal(next(it), expected[1 + k])
        it.set_state(state)
        assert np.array_equal(next(it), expected[1])
