"""``mp_prefetch`` against grain 0.2.18 with 1, 2 and 3 workers.

The same elements in the same order, the same state before every step and after
the end, restore from grain's state at every step, grain restored from
grainlike's, and the same behaviour after an error in a worker. grain's workers
are spawned processes (seconds each), so grain runs only twice per worker count.
"""

import gc
import warnings

import numpy as np
import pytest

from grainlike.core.errors import WorkersDropRemaindersWarning

from tests.compat.dataset_pairs import GRAINLIKE, assert_same, grain_namespace, rest
from tests.dataset.test_mp_prefetch import FailAt
from tests.helpers.leaks import no_leaks  # noqa: F401  (a fixture)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", autouse=True)
def grain_started(grain_ref):
    """grain after its first mp_prefetch, which opens descriptors it keeps for good.

    Module-scoped, so it runs before ``no_leaks`` takes its snapshot. Its run is
    the one-worker reference the tests below compare with (each grain run spawns
    workers that import JAX, seconds each).
    """
    _grain_run(grain_ref, 1)
    yield grain_ref
    # grain's arrays are deleted while their module can still release them (not at exit).
    _grain_runs.clear()
    gc.collect()


def _pipeline(lib, workers, n=17, buffer_size=1):
    # A random map on the iterator draws per worker process, and the filter
    # makes the workers' shares uneven.
    ds = (
        lib.MapDataset.range(n)
        .map(lambda x: x * 3)
        .to_iter_dataset()
        .random_map(lambda x, rng: (x, int(rng.integers(0, 1 << 30))), seed=7)
        .filter(lambda p: p[0] % 4 != 1)
        .batch(2)
    )
    return ds.mp_prefetch(lib.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=buffer_size))


def _run(ds):
    """Elements, the state before each, and the state after the end; then closes."""
    it = iter(ds)
    values, states = [], []
    while True:
        states.append(it.get_state())
        try:
            values.append(next(it))
        except StopIteration:
            break
    end = it.get_state()  # the end is found out within the last next()
    it.close()
    return values, states[:-1], end


_grain_runs: dict = {}


def _grain_run(grain_ref, workers):
    """grain's ``_run(_pipeline(grain, workers))``, computed once per worker count.

    Starting grain's workers dominates these tests' time. The per-worker buffer
    size only changes how far the workers run ahead, not the elements or the
    states the consumer sees, so the run serves every buffer size.
    """
    if workers not in _grain_runs:
        values, states, end = _run(_pipeline(grain_namespace(grain_ref), workers))
        # Kept as plain copies: grain's own arrays hold its shared memory open.
        _grain_runs[workers] = ([_plain(v) for v in values], states, end)
        del values
        gc.collect()
    return _grain_runs[workers]


def _plain(value):
    if isinstance(value, np.ndarray):
        # A copy of the same type (grain's SharedMemoryArray without its segment).
        return np.array(value, subok=False).view(type(value))
    if isinstance(value, (tuple, list)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# One worker, and several with uneven shares (the filter).
@pytest.mark.parametrize("workers", [1, 3])
def test_mp_prefetch_matches_reference(grain_ref, no_leaks, workers):
    grain_lib = grain_namespace(grain_ref)
    g_values, g_states, g_end = _grain_run(grain_ref, workers)
    l_ds = _pipeline(GRAINLIKE, workers)
    l_values, l_states, l_end = _run(l_ds)
    assert_same(g_values, l_values, "elements")
    assert l_states == g_states
    assert l_end == g_end
    # grainlike restored from each of grain's states.
    for k, state in enumerate(g_states + [g_end]):
        it = iter(l_ds)
        it.set_state(state)
        assert it.get_state() == state
        assert_same(g_values[k:], rest(it), f"grainlike restored from grain's state {k}")
        assert it.get_state() == g_end
        it.close()
    # grain restored from grainlike's state mid-way.
    k = len(l_states) // 2
    it = iter(_pipeline(grain_lib, workers))
    it.set_state(l_states[k])
    assert_same(l_values[k:], rest(it), f"grain restored from grainlike's state {k}")
    assert it.get_state() == l_end
    it.close()


@pytest.mark.parametrize("workers", [1, 3])
def test_set_state_on_a_running_iterator_keeps_its_workers_and_matches_reference(grain_ref, no_leaks, workers):
    # As grain, set_state sends the running workers their states (grain's
    # test_set_state_does_not_restart_process): the same processes go on, with
    # grain's outputs and states from the restored one on.
    g_values, g_states, g_end = _grain_run(grain_ref, workers)
    states = g_states + [g_end]
    it = iter(_pipeline(GRAINLIKE, workers, buffer_size=3))
    next(it)
    pids = it._pool.pids
    assert len(pids) == workers
    # Back to the start; to the end (every worker exhausted) and on from there
    # into the middle; then to states whose workers have outputs computed ahead.
    for k in (0, len(states) - 1, len(states) // 2, 1, len(states) // 2 + 1):
        it.set_state(states[k])
        assert it.get_state() == states[k]
        got = [next(it) for _ in range(min(2, len(g_values) - k))]
        assert_same(g_values[k : k + len(got)], got, f"after set_state to grain's state {k}")
        if k + len(got) < len(g_states):  # (g_end is the state after the StopIteration)
            assert it.get_state() == g_states[k + len(got)]
    # Two states set before the next output: the later one holds.
    it.set_state(states[3])
    it.set_state(states[1])
    assert_same(g_values[1:], rest(it), "after two set_state calls")
    assert it.get_state() == g_end
    assert it._pool.pids == pids
    it.close()


def _steps(ds, limit=50):
    """Each step's element or exception type, with the state after it."""
    it = iter(ds)
    out = []
    for _ in range(limit):
        try:
            out.append((next(it), it.get_state()))
        except StopIteration:
            break
        except Exception as e:  # noqa: BLE001 - the type is what is compared
            out.append((type(e), it.get_state()))
    it.close()
    return out


def test_error_in_a_worker_matches_reference(grain_ref, no_leaks):
    def build(lib):
        ds = lib.MapDataset.range(12).map(FailAt(5)).to_iter_dataset()
        return ds.mp_prefetch(lib.MultiprocessingOptions(num_workers=2))

    expected = _steps(build(grain_namespace(grain_ref)))
    assert [v for v, _ in expected].count(KeyError) == 1  # the reference failed once
    assert _steps(build(GRAINLIKE)) == expected


def test_options_set_after_mp_prefetch_reach_the_workers(grain_ref, no_leaks):
    from grain._src.python.dataset import base as grain_base
    from grain._src.python.dataset import dataset as grain_dataset

    from grainlike.dataset import WithOptionsIterDataset
    from grainlike.dataset.nodes.options import DatasetOptions

    def build(lib, with_options, options):
        ds = lib.MapDataset.range(2400).to_iter_dataset().filter(lambda x: x % 10 == 0)
        ds = ds.mp_prefetch(lib.MultiprocessingOptions(num_workers=2))
        return with_options(ds, options(filter_raise_threshold_ratio=0.5))

    def outcome(ds):
        it = iter(ds)
        try:
            return len(list(it))
        except ValueError as e:
            return ("ValueError", "skipped" in str(e))
        finally:
            it.close()

    grain_lib = grain_namespace(grain_ref)
    expected = outcome(build(grain_lib, grain_dataset.WithOptionsIterDataset, grain_base.DatasetOptions))
    assert expected == ("ValueError", True)  # the filter in a worker raised
    assert outcome(build(GRAINLIKE, WithOptionsIterDataset, DatasetOptions)) == expected


def test_workers_dropping_their_own_remainders_warn_and_match_reference(grain_ref, no_leaks):
    # 14 records over 2 workers: slices of 7, one batch of 4 each (8 records);
    # without workers 3 batches (12). grainlike keeps grain's output and states.
    def build(lib):
        ds = lib.MapDataset.range(14).to_iter_dataset().batch(4, drop_remainder=True)
        return ds.mp_prefetch(lib.MultiprocessingOptions(num_workers=2))

    g_values, g_states, g_end = _run(build(grain_namespace(grain_ref)))
    assert [v.tolist() for v in g_values] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    with pytest.warns(WorkersDropRemaindersWarning, match="delivers 8 of the 14 elements.*without workers delivers 12 in 3"):
        ds = build(GRAINLIKE)
    l_values, l_states, l_end = _run(ds)
    assert_same(g_values, l_values, "elements")
    assert (l_states, l_end) == (g_states, g_end)


def _sequential_pipeline(lib, workers):
    # Each worker reads a contiguous range of the 13 records (5, 4, 4), shuffled
    # within it; a random map on the iterator draws per worker.
    ds = lib.MapDataset.range(2, 41, 3).shuffle(seed=5).map(lambda x: x + 1).to_iter_dataset()
    ds = ds.random_map(lambda x, rng: (x, int(rng.integers(0, 1 << 30))), seed=9).batch(2)
    return ds.mp_prefetch(lib.MultiprocessingOptions(num_workers=workers), sequential_slice=True)


def test_mp_prefetch_sequential_slice_matches_reference(grain_ref, no_leaks):
    grain_lib = grain_namespace(grain_ref)
    g_values, g_states, g_end = _run(_sequential_pipeline(grain_lib, 3))
    l_ds = _sequential_pipeline(GRAINLIKE, 3)
    l_values, l_states, l_end = _run(l_ds)
    assert_same(g_values, l_values, "elements")
    assert (l_states, l_end) == (g_states, g_end)
    for k in (1, len(g_states) // 2, len(g_states)):
        it = iter(l_ds)
        it.set_state((g_states + [g_end])[k])
        assert_same(g_values[k:], rest(it), f"grainlike restored from grain's state {k}")
        it.close()
    k = len(l_states) // 2
    it = iter(_sequential_pipeline(grain_lib, 3))
    it.set_state(l_states[k])
    assert_same(l_values[k:], rest(it), f"grain restored from grainlike's state {k}")
    it.close()


def test_sequential_slice_drops_each_workers_remainder_warns_and_matches_reference(grain_ref, no_leaks):
    # 14 records over 3 workers: ranges of 5, 5, 4, one batch of 4 each (12
    # records); without workers 3 batches (12) too; over 4 workers (4, 4, 3, 3):
    # two batches (8).
    def build(lib, workers):
        ds = lib.MapDataset.range(14).to_iter_dataset().batch(4, drop_remainder=True)
        return ds.mp_prefetch(lib.MultiprocessingOptions(num_workers=workers), sequential_slice=True)

    g_values, g_states, g_end = _run(build(grain_namespace(grain_ref), 4))
    assert [v.tolist() for v in g_values] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.warns(WorkersDropRemaindersWarning, match="delivers 8 of the 14 elements.*without workers delivers 12 in 3"):
        ds = build(GRAINLIKE, 4)
    l_values, l_states, l_end = _run(ds)
    assert_same(g_values, l_values, "elements")
    assert (l_states, l_end) == (g_states, g_end)
    with warnings.catch_warnings():
        warnings.simplefilter("error", WorkersDropRemaindersWarning)
        assert [v.tolist() for v in build(GRAINLIKE, 3)] == [[0, 1, 2, 3], [5, 6, 7, 8], [10, 11, 12, 13]]
