"""grain's ``ProcessPrefetchIterDataset`` and ``multiprocess_prefetch`` on grainlike's workers.

Expected values follow grain 0.2.18 (``transformations/process_prefetch.py``):
``ProcessPrefetchIterDataset`` runs the parent iterator, unsliced, in one
background process and its state is the parent iterator's state;
``multiprocess_prefetch(ds, num_workers, buffer_size, ...)`` is what
``ds.mp_prefetch(MultiprocessingOptions(num_workers, buffer_size), ...)`` is.
"""

import os
import sys

import pytest

from grainlike.dataset import MapDataset
from grainlike.dataset.base import get_next_index, set_next_index
from grainlike.dataset.nodes.options import DatasetOptions, MultiprocessingOptions
from grainlike.dataset.parallel.process_prefetch import ProcessPrefetchIterDataset, multiprocess_prefetch
from grainlike.dataset.transformations.seed import WithOptionsIterDataset
from grainlike.core.errors import WorkerDiedError
from tests.helpers import leaks

pytestmark = pytest.mark.timeout(90)


def _odd(n=20):
    return MapDataset.range(n).to_iter_dataset().filter(lambda x: x % 2 == 1)


def test_process_prefetch_outputs_are_the_parents_computed_in_another_process():
    it = iter(ProcessPrefetchIterDataset(MapDataset.range(6).to_iter_dataset().map(lambda x: (x, os.getpid())), 2))
    try:
        out = list(it)
    finally:
        it.close()
    assert [x for x, _ in out] == list(range(6))
    assert len({pid for _, pid in out}) == 1 and out[0][1] != os.getpid()


def test_process_prefetch_state_is_the_parent_iterators_state_and_restores():
    parent = _odd()
    it = iter(ProcessPrefetchIterDataset(parent, buffer_size=3))
    reference = iter(parent)
    states, values = [], []
    for _ in range(6):
        states.append(it.get_state())
        assert states[-1] == reference.get_state()
        values.append(next(it))
        next(reference)
    for step in (0, 2, 5):
        it.set_state(states[step])
        assert [next(it) for _ in range(step, 6)] == values[step:]
    it.close()


def test_process_prefetch_set_state_keeps_the_process_and_restores_the_parents_outputs(no_leaks):
    # grain sends the state to its running process (its
    # test_set_state_does_not_restart_process); the outputs from a state are
    # the parent iterator's from that state.
    parent = _odd(40)
    it = iter(ProcessPrefetchIterDataset(parent.map(lambda x: (x, os.getpid())), buffer_size=3))
    states, values = [], []
    for _ in range(8):
        states.append(it.get_state())
        values.append(next(it))
    pid = values[0][1]
    assert pid != os.getpid() and {p for _, p in values} == {pid}
    for step in (7, 0, 4, 4, 1):
        it.set_state(states[step])
        assert it.get_state() == states[step]
        assert [next(it) for _ in range(step, 8)] == values[step:]
    it.set_state(states[2])
    reference = iter(parent)
    reference.set_state(states[2])
    assert [x for x, _ in it] == list(reference)
    assert it._pool.pids == [pid]
    it.close()


def test_process_prefetch_worker_init_fn_takes_no_arguments():
    def init():
        os.environ["GRAINLIKE_TEST_INIT"] = "ran"

    ds = MapDataset.range(2).map(lambda x: os.environ.get("GRAINLIKE_TEST_INIT")).to_iter_dataset()
    assert list(ProcessPrefetchIterDataset(ds, buffer_size=1, worker_init_fn=init)) == ["ran", "ran"]


@pytest.mark.parametrize("size", [0, -1])
def test_process_prefetch_rejects_a_buffer_size_below_one(size):
    with pytest.raises(ValueError, match="`buffer_size` must be greater than 0"):
        ProcessPrefetchIterDataset(_odd(), buffer_size=size)


@pytest.mark.parametrize("make", ["process_prefetch", "one_worker"])
def test_next_index_is_read_and_moved_with_one_process(make):
    ds = MapDataset.range(10).to_iter_dataset()
    ds = ProcessPrefetchIterDataset(ds, 1) if make == "process_prefetch" else multiprocess_prefetch(ds, 1)
    it = iter(ds)
    assert get_next_index(it) == 0
    assert [next(it), next(it)] == [0, 1]
    assert get_next_index(it) == 2
    for i in (7, 3):
        set_next_index(it, i)
        assert get_next_index(it) == i
        assert next(it) == i
    it.close()


def test_next_index_is_not_supported_with_several_workers():
    it = iter(multiprocess_prefetch(MapDataset.range(10).to_iter_dataset(), num_workers=2))
    with pytest.raises(NotImplementedError, match="more than one"):
        get_next_index(it)
    with pytest.raises(NotImplementedError, match="more than one"):
        set_next_index(it, 3)
    it.close()


def test_multiprocess_prefetch_matches_mp_prefetch_outputs_and_states():
    ds = _odd()
    a = iter(multiprocess_prefetch(ds, num_workers=2, buffer_size=3))
    b = iter(ds.mp_prefetch(MultiprocessingOptions(num_workers=2, per_worker_buffer_size=3)))
    for _ in range(10):
        assert a.get_state() == b.get_state()
        assert next(a) == next(b)
    a.close()
    b.close()
    assert multiprocess_prefetch(ds, num_workers=0) is ds


@pytest.mark.parametrize("make", ["process_prefetch", "mp_prefetch"])
def test_options_set_before_the_workers_hold_for_a_filter_after_them(make):
    ds = MapDataset.source([1, 2, 3]).repeat(1000).to_iter_dataset()
    ds = WithOptionsIterDataset(ds, DatasetOptions(filter_raise_threshold_ratio=0.1))
    ds = ProcessPrefetchIterDataset(ds, 1) if make == "process_prefetch" else multiprocess_prefetch(ds, 1)
    with pytest.raises(ValueError, match="filter"):
        list(ds.filter(lambda x: x > 2))


def _exit_123(x):
    sys.exit(123)


@pytest.mark.parametrize("warm_start", [False, True])
def test_sys_exit_in_a_transform_ends_the_worker_and_the_caller_gets_grains_runtime_error(warm_start):
    ds = _odd().map(_exit_123)
    options = MultiprocessingOptions(num_workers=1, warm_start=warm_start)
    it = iter(ds.mp_prefetch(options))
    # grain raises a RuntimeError with these words; WorkerDiedError is one.
    with pytest.raises(RuntimeError, match="Worker process was terminated unexpectedly with exit code 123") as info:
        next(it)
    assert isinstance(info.value, WorkerDiedError)
    it.close()
    assert leaks.wait_until(lambda: not leaks.worker_children())


class _Failing:
    """A transform whose error is raised two calls deep."""

    def __call__(self, x):
        return self.check(x)

    def check(self, x):
        if x == 3:
            raise ValueError("element 3 is refused")
        return x


@pytest.mark.parametrize("make", ["process_prefetch", "mp_prefetch"])
def test_an_error_in_a_worker_carries_the_workers_frames_in_its_traceback(make):
    import traceback

    ds = MapDataset.range(10).to_iter_dataset().map(_Failing())
    ds = ProcessPrefetchIterDataset(ds, 2) if make == "process_prefetch" else multiprocess_prefetch(ds, 2)
    it = iter(ds)
    with pytest.raises(ValueError, match="element 3 is refused") as info:
        for _ in range(5):
            next(it)
    frames = traceback.extract_tb(info.value.__traceback__)
    # The innermost entries are the worker's, with their files and lines (so their source shows).
    assert [f.name for f in frames[-2:]] == ["__call__", "check"]
    assert frames[-1].filename == __file__ and frames[-1].line == 'raise ValueError("element 3 is refused")'
    it.close()
