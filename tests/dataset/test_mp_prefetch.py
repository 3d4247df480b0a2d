"""``IterDataset.mp_prefetch``: slices per worker, round-robin, state, errors, shutdown.

The expected outputs follow grain 0.2.18's rule (worker ``w`` of ``W`` computes the
pipeline with the MapDataset under ``to_iter_dataset()`` sliced ``[w::W]``, the
outputs are taken round-robin, skipping workers that ended); the differential
tests against grain itself are in tests/compat/test_mp_prefetch_compat.py.
"""

import gc
import os
import signal
import sys
import threading
import traceback
import warnings

import numpy as np
import pytest

from grainlike.core.errors import ClosedIteratorError, InvalidStateError, WorkersDropRemaindersWarning
from grainlike.core.transforms import MapTransform
from grainlike.dataset import IterDataset, MapDataset
from grainlike.dataset.conformance import assert_equal_output_after_checkpoint
from grainlike.dataset.nodes.options import MultiprocessingOptions
from grainlike.dataset.parallel.process_prefetch import MultiprocessPrefetchIterDataset
from grainlike.dataset.transformations.repeat import RepeatIterDataset
from grainlike.core.errors import WorkerDiedError
from tests.helpers import leaks

pytestmark = pytest.mark.timeout(90)


def _options(workers, **kw):
    return MultiprocessingOptions(num_workers=workers, **kw)


def _pipeline(n=11, sl=None):
    """range -> map -> to_iter_dataset -> filter -> batch, optionally sliced at the map."""
    ds = MapDataset.range(n).map(lambda x: x * 10)
    if sl is not None:
        ds = ds.slice(sl)
    return ds.to_iter_dataset().filter(lambda x: x % 30 != 0).batch(2)


def _round_robin(per_worker):
    out = []
    for i in range(max(len(p) for p in per_worker)):
        out += [p[i] for p in per_worker if i < len(p)]
    return out


def _plain(values):
    return [np.asarray(v).tolist() for v in values]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_each_worker_computes_its_slice_and_outputs_alternate(no_leaks, workers):
    per_worker = [_plain(_pipeline(sl=slice(w, None, workers))) for w in range(workers)]
    ds = _pipeline().mp_prefetch(_options(workers))
    assert isinstance(ds, MultiprocessPrefetchIterDataset)
    it = iter(ds.map(lambda b: b))  # stages after mp_prefetch run in the caller
    assert _plain(it) == _round_robin(per_worker)
    it.close()


def test_outputs_are_computed_in_workers_that_do_not_import_jax(no_leaks):
    ds = MapDataset.range(8).to_iter_dataset().map(lambda x: (x, os.getpid(), "jax" in sys.modules))
    it = iter(ds.mp_prefetch(_options(2)))
    got = list(it)
    it.close()
    assert [x for x, _, _ in got] == list(range(8))
    pids = {pid for _, pid, _ in got}
    assert len(pids) == 2 and os.getpid() not in pids
    assert not any(jax for _, _, jax in got)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_restores_at_every_step(no_leaks, workers):
    assert_equal_output_after_checkpoint(_pipeline(9).mp_prefetch(_options(workers)))


def test_state_names_each_worker_and_whose_turn_is_next(no_leaks):
    ds = MapDataset.range(5).to_iter_dataset().mp_prefetch(_options(2))
    it = iter(ds)
    assert it.get_state() == {
        "next_index_in_cycle": 0,
        "next_index_in_datasets": 2,
        "iterators_in_use_indices": [0, 1],
        "iterators_in_use_states": [{"next_index": 0}, {"next_index": 0}],
        "exhausted": [0, 0],
        "future_states": {},
    }
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    state = it.get_state()
    assert state["next_index_in_cycle"] == 1
    # Each worker's iterator counts its own slice.
    assert state["iterators_in_use_states"] == [{"next_index": 2}, {"next_index": 1}]
    assert list(it) == [3, 4]
    end = it.get_state()
    assert end["exhausted"] == [1, 1]
    assert end["iterators_in_use_states"] == [{"next_index": 3}, {"next_index": 2}]
    it.close()


def test_set_state_moves_a_running_iterator(no_leaks):
    ds = _pipeline(15).mp_prefetch(_options(2))
    it = iter(ds)
    full = _plain(it)
    it.close()
    it = iter(ds)
    next(it), next(it), next(it)
    mid = it.get_state()
    rest = _plain(it)
    it.set_state(mid)  # the workers go on from the saved states
    assert _plain(it) == rest == full[3:]
    it.close()


def test_set_state_keeps_the_worker_processes_and_drops_their_shared_memory_outputs(no_leaks):
    # Outputs of 256 KiB travel in shared-memory segments; 4 per worker are
    # computed ahead when set_state comes. The stale ones are dropped and their
    # segments reused (no_leaks: no fd, segment or process left).
    def big(x):
        return np.full(1 << 15, x, np.float64)

    ds = MapDataset.range(40).map(big).to_iter_dataset().mp_prefetch(_options(2, per_worker_buffer_size=4))
    it = iter(ds)
    states = []
    for _ in range(12):
        states.append(it.get_state())
        next(it)
    pids = it._pool.pids
    held = next(it)  # an output the user keeps across the set_state calls
    for step in (11, 0, 5, 2, 11, 7):
        it.set_state(states[step])
        got = [int(next(it)[0]) for _ in range(3)]
        assert got == [step, step + 1, step + 2]
    assert it._pool.pids == pids
    assert int(held[0]) == 12 and (held == 12).all()
    it.set_state(states[3])
    assert [int(b[0]) for b in it] == list(range(3, 40))
    assert it._pool.pids == pids
    it.close()


def test_worker_init_fn_runs_once_per_worker_across_set_state(no_leaks, tmp_path):
    # grain calls it once per process; set_state keeps the processes.
    def init(worker_index, worker_count):
        with open(tmp_path / f"init{worker_index}", "a") as f:
            f.write(f"{os.getpid()}\n")

    it = iter(MapDataset.range(10).to_iter_dataset().mp_prefetch(_options(2), worker_init_fn=init))
    start = it.get_state()
    assert list(it) == list(range(10))
    it.set_state(start)
    assert list(it) == list(range(10))
    it.close()
    for w in range(2):
        assert len((tmp_path / f"init{w}").read_text().split()) == 1


def test_a_worker_killed_after_set_state_is_reported(no_leaks):
    ds = MapDataset.range(400).to_iter_dataset().mp_prefetch(_options(2))
    it = iter(ds)
    start = it.get_state()
    assert [next(it) for _ in range(4)] == [0, 1, 2, 3]
    it.set_state(start)
    pid = it._pool.pids[1]
    os.kill(pid, signal.SIGKILL)
    assert leaks.wait_until(lambda: leaks.process_ended(pid))
    got = []
    with pytest.raises(WorkerDiedError, match=r"worker 1 of 2 .*SIGKILL"):
        while True:
            got.append(next(it))
    assert got == list(range(len(got)))
    it.close()


def test_set_state_after_a_worker_died_starts_new_workers(no_leaks):
    # A worker that cannot take the state (it died; one whose error was raised
    # is stopped too) is replaced, as before any output.
    ds = MapDataset.range(20).to_iter_dataset().mp_prefetch(_options(2))
    it = iter(ds)
    start = it.get_state()
    assert [next(it) for _ in range(2)] == [0, 1]
    old = it._pool.pids
    os.kill(old[0], signal.SIGKILL)
    assert leaks.wait_until(lambda: leaks.process_ended(old[0]))
    it.set_state(start)
    assert list(it) == list(range(20))
    assert not set(it._pool.pids) & set(old)
    it.close()


def test_repeat_over_workers_keeps_the_worker_processes(no_leaks):
    ds = MapDataset.range(9).to_iter_dataset().map(lambda _: os.getpid())
    it = iter(RepeatIterDataset(ds.mp_prefetch(_options(3)), num_epochs=3))
    got = list(it)
    it.close()
    assert len(got) == 27 and len(set(got)) == 3 and os.getpid() not in got


def test_bad_states_are_refused_before_anything_changes(no_leaks):
    ds = _pipeline(10).mp_prefetch(_options(2))
    it = iter(ds)
    first = _plain([next(it)])
    good = it.get_state()
    three_workers = iter(_pipeline(10).mp_prefetch(_options(3))).get_state()
    # A whole state of 3 workers restores on 2 (tests/elastic/); one whose worker
    # states do not match its worker count is refused.
    three_workers["iterators_in_use_states"] = three_workers["iterators_in_use_states"][:2]
    with pytest.raises(InvalidStateError, match=r"iterators_in_use_states.* must be a list of 3 entries"):
        it.set_state(three_workers)
    with pytest.raises(KeyError, match="exhausted"):
        it.set_state({k: v for k, v in good.items() if k != "exhausted"})
    with pytest.raises(InvalidStateError, match="next_index_in_cycle"):
        it.set_state({**good, "next_index_in_cycle": 2})
    with pytest.raises(IndexError):
        it.set_state({**good, "iterators_in_use_states": [{"next_index": 99}, {"next_index": 0}]})
    assert it.get_state() == good
    rest = _plain(it)
    it2 = iter(ds)
    assert first + rest == _plain(it2)
    it.close()
    it2.close()


class FailAt:
    def __init__(self, bad):
        self.bad = bad

    def __call__(self, x):
        if x == self.bad:
            raise KeyError(f"element {x} is bad")
        return x


def test_an_error_arrives_once_with_its_type_then_that_worker_counts_as_ended(no_leaks):
    # Worker 1 of 2 computes 1, 3, 5, 7, 9; 5 fails.
    ds = MapDataset.range(10).map(FailAt(5)).to_iter_dataset().mp_prefetch(_options(2))
    it = iter(ds)
    got = []
    with pytest.raises(KeyError, match="element 5 is bad") as info:
        while True:
            got.append(next(it))
    assert got == [0, 1, 2, 3, 4]
    notes = "\n".join(info.value.__notes__)
    assert "raised in worker 1 (pid" in notes
    # The worker's frames end the exception's traceback, down to the transform.
    assert traceback.extract_tb(info.value.__traceback__)[-1].name == "__call__"
    after_error = it.get_state()
    assert after_error["exhausted"] == [0, 0] and after_error["iterators_in_use_states"][1] == {"next_index": 2}
    # As grain: the failed worker is skipped from then on.
    assert list(it) == [6, 8]
    assert it.get_state()["exhausted"] == [1, 1]
    it.close()


def test_a_killed_worker_is_reported_at_every_later_call(no_leaks):
    ds = MapDataset.range(400).to_iter_dataset().mp_prefetch(_options(2))
    it = iter(ds)
    got = [next(it) for _ in range(4)]
    assert got == [0, 1, 2, 3]
    os.kill(it._pool.pids[1], signal.SIGKILL)
    with pytest.raises(WorkerDiedError, match=r"worker 1 of 2 .*SIGKILL"):
        while True:
            got.append(next(it))
    # Not a short epoch (grain's): the rest of worker 1's elements are not silently dropped.
    with pytest.raises(WorkerDiedError, match=r"cannot go on .*grainlike worker 1 of 2"):
        next(it)
    assert got == list(range(len(got)))
    it.close()


def test_worker_init_fn_runs_in_each_worker_before_the_dataset_loads(no_leaks, tmp_path):
    def init(worker_index, worker_count):
        os.environ["GRAINLIKE_TEST_WORKER"] = f"{worker_index}/{worker_count}"
        (tmp_path / f"init{worker_index}").write_text(str(os.getpid()))

    ds = MapDataset.range(6).to_iter_dataset().map(lambda x: (x, os.environ.get("GRAINLIKE_TEST_WORKER")))
    it = iter(ds.mp_prefetch(_options(3), worker_init_fn=init))
    got = list(it)
    it.close()
    assert got == [(x, f"{x % 3}/3") for x in range(6)]
    pids = {int((tmp_path / f"init{w}").read_text()) for w in range(3)}
    assert len(pids) == 3 and os.getpid() not in pids
    assert "GRAINLIKE_TEST_WORKER" not in os.environ


def test_zero_workers_is_the_dataset_itself():
    ds = _pipeline()
    assert ds.mp_prefetch(_options(0)) is ds


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="buffer_size"):
        _pipeline().mp_prefetch(_options(2, per_worker_buffer_size=0))
    with pytest.raises(ValueError, match="num_workers"):
        MultiprocessPrefetchIterDataset(_pipeline(), _options(0))


def test_big_batches_come_through_shared_memory_and_stay_valid(no_leaks):
    ds = (
        MapDataset.range(8)
        .map(lambda x: np.full((64, 512), x, np.float32))
        .to_iter_dataset()
        .batch(2)
        .mp_prefetch(_options(2))
    )
    it = iter(ds)
    batches = list(it)
    it.close()
    gc.collect()
    firsts = [b[:, 0, 0].tolist() for b in batches]
    assert firsts == [[0.0, 2.0], [1.0, 3.0], [4.0, 6.0], [5.0, 7.0]]
    assert all(b.shape == (2, 64, 512) for b in batches)
    view = batches[-1][1]
    del batches
    gc.collect()
    assert (view == 7.0).all()


def test_a_dataset_that_cannot_be_pickled_is_named(no_leaks):
    lock = threading.Lock()
    ds = MapDataset.range(4).map(lambda x: (x, lock)).to_iter_dataset().mp_prefetch(_options(2))
    it = iter(ds)
    with pytest.raises(TypeError, match="lock") as info:
        next(it)
    assert any("cannot be pickled" in n and "Map" in n for n in info.value.__notes__)
    it.close()


class _HoldsGenerator(MapTransform):
    def __init__(self):
        self.numbers = (i for i in range(3))

    def map(self, x):
        return x


class _ReturnsGenerator(MapTransform):
    def map(self, x):
        return (x for _ in range(2))


def _notes_of_first_error(ds):
    it = iter(ds)
    with pytest.raises(TypeError, match="generator") as info:
        next(it)
    it.close()
    return "\n".join(info.value.__notes__)


@pytest.mark.parametrize("on", ["map_dataset", "iter_dataset"])
def test_a_transform_that_cannot_be_pickled_is_named_with_its_definition(no_leaks, on):
    ds = MapDataset.range(4)
    ds = ds.map(_HoldsGenerator()).to_iter_dataset() if on == "map_dataset" else ds.to_iter_dataset().map(_HoldsGenerator())
    notes = _notes_of_first_error(ds.mp_prefetch(_options(2)))
    assert f"the transform _HoldsGenerator ({__file__}:" in notes
    assert "cannot be pickled (TypeError: cannot pickle 'generator' object)" in notes


@pytest.mark.parametrize("batch", [False, True])
def test_an_output_holding_a_generator_names_the_transform_it_went_through(no_leaks, batch):
    ds = MapDataset.range(4).to_iter_dataset().map(_ReturnsGenerator())
    notes = _notes_of_first_error((ds.batch(2) if batch else ds).mp_prefetch(_options(2)))
    assert f"went through the user transforms _ReturnsGenerator ({__file__}:" in notes
    if batch:  # batch stacked the generators into an object array
        assert "the leaf at <root> (an object array holding builtins.generator)" in notes


def test_a_source_iterdataset_that_cannot_be_sliced_is_named(no_leaks):
    class Count(IterDataset):
        def __iter__(self):
            return iter(MapDataset.range(3).to_iter_dataset())

    it = iter(Count().mp_prefetch(_options(2)))
    with pytest.raises(ValueError, match="Cannot slice `IterDataset` source"):
        next(it)
    it.close()


def test_closed_iterator_refuses_next_and_stops_its_workers(no_leaks):
    it = iter(_pipeline(40).mp_prefetch(_options(2)))
    next(it)
    pids = set(it._pool.pids)
    it.close()
    assert leaks.wait_until(lambda: not pids & leaks.worker_children())
    with pytest.raises(ClosedIteratorError):
        next(it)
    it.close()  # idempotent


def test_start_prefetch_and_garbage_collection(no_leaks):
    it = iter(_pipeline(40).mp_prefetch(_options(2)))
    it.start_prefetch()
    assert leaks.wait_until(lambda: len(it._pool.pids) == 2)
    pids = set(it._pool.pids)
    del it
    gc.collect()
    assert leaks.wait_until(lambda: not pids & leaks.worker_children())


def test_warm_start_gives_the_workers_outputs_and_states(no_leaks):
    ds = _pipeline(13)
    cold = iter(ds.mp_prefetch(_options(2)))
    expected = []
    for v in cold:
        expected.append((np.asarray(v).tolist(), cold.get_state()))
    cold.close()
    warm = iter(ds.mp_prefetch(_options(2, warm_start=True)))
    got = []
    for v in warm:
        got.append((np.asarray(v).tolist(), warm.get_state()))
    warm.close()
    assert got == expected


def test_worker_state_snapshots_do_not_change_with_the_iterator():
    from grainlike.dataset.parallel.worker_slice_task import snapshot

    flat = {"next_index": 3, "name": "a", "x": None}
    nested = {"parent": {"next_index": 3}, "buffer": [1, 2]}
    flat_copy, nested_copy = snapshot(flat), snapshot(nested)
    flat["next_index"] = 4
    nested["parent"]["next_index"] = 4
    nested["buffer"].append(3)
    assert flat_copy == {"next_index": 3, "name": "a", "x": None}
    assert nested_copy == {"parent": {"next_index": 3}, "buffer": [1, 2]}


def _batched_then_workers(n, workers, batch=8, drop_remainder=True):
    ds = MapDataset.range(n).to_iter_dataset().batch(batch, drop_remainder=drop_remainder)
    return ds.mp_prefetch(_options(workers))


def test_workers_dropping_their_own_remainders_warn_with_both_counts(no_leaks):
    # 100 records over 8 workers: slices of 13 and 12, one batch of 8 each (64
    # records); without workers 12 batches (96). grain yields the same 64.
    with pytest.warns(WorkersDropRemaindersWarning) as caught:
        ds = _batched_then_workers(100, 8)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "delivers 64 of the 100 elements" in message and "in 8 outputs" in message
    assert "without workers delivers 96 in 12" in message
    assert "batch after mp_prefetch" in message and ".batch(8, drop_remainder=True)" in message
    assert caught[0].filename == __file__  # points at the mp_prefetch call
    it = iter(ds)
    batches = _plain(it)
    it.close()
    per_worker = [list(range(100))[w::8][:8] for w in range(8)]
    assert batches == per_worker  # the output is kept (grain's)


@pytest.mark.parametrize(
    "build",
    [
        lambda: _batched_then_workers(128, 8),  # slices of 16: nothing left over
        lambda: _batched_then_workers(100, 4),  # slices of 25: 3 batches each, 12 in all
        lambda: _batched_then_workers(100, 8, drop_remainder=False),
        lambda: _batched_then_workers(100, 1),
        lambda: MapDataset.range(100).to_iter_dataset().mp_prefetch(_options(8)).batch(8, drop_remainder=True),
        lambda: MapDataset.range(100).batch(8, drop_remainder=True).to_iter_dataset().mp_prefetch(_options(8)),
        lambda: MapDataset.range(100).repeat().to_iter_dataset().batch(8, drop_remainder=True).mp_prefetch(_options(8)),
    ],
    ids=["divisible-slices", "same-count", "no-drop", "one-worker", "batch-after", "batch-on-mapdataset", "endless"],
)
def test_no_remainder_warning_when_workers_drop_nothing_extra(build):
    with warnings.catch_warnings():
        warnings.simplefilter("error", WorkersDropRemaindersWarning)
        build()


def test_nested_batches_warn_when_fewer_records_reach_the_output():
    # More outputs with workers (8 against 6) but fewer records (64 against 96).
    match = r"delivers 64 of the 100 elements of its to_iter_dataset\(\) in 8 outputs.*delivers 96 in 6:"
    with pytest.warns(WorkersDropRemaindersWarning, match=match):
        MapDataset.range(100).to_iter_dataset().batch(2).batch(4, drop_remainder=True).batch(2).mp_prefetch(_options(8))
