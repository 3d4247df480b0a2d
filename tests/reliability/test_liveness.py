"""Liveness: a worker that stops making progress is reported, never waited for forever.

Also: close() and get_state() from another thread return while next() is blocked.
"""

import os
import signal
import time

import pytest

from grainlike.core.errors import ClosedIteratorError
from grainlike.dataset.base import MapDataset
from grainlike.dataset.nodes.options import MultiprocessingOptions
from grainlike.core.errors import WorkerStalledError
from grainlike.workers.liveness import STARTUP_TIMEOUT_S, allowed_stall_s
from grainlike.workers.pool import WorkerPool
from tests.helpers.threads import next_in_thread
from tests.reliability.transforms import Spin, StuckAt

pytestmark = pytest.mark.timeout(60)


def _prefetched(n, transform, stall_timeout_s, workers=2):
    ds = MapDataset.range(n).to_iter_dataset().map(transform)
    return ds.mp_prefetch(MultiprocessingOptions(num_workers=workers, stall_timeout_s=stall_timeout_s))


class Endless:
    """A WorkerTask: every worker yields its index forever."""

    def outputs(self, worker_index, worker_count, state, alloc):
        while True:
            time.sleep(0.01)
            yield state + 1, worker_index

    def end_state(self, worker_index, worker_count, state):
        return state

    def pickling_error(self, error):
        return error


def test_a_stopped_worker_is_reported_naming_it_and_why_it_has_no_stack(no_leaks):
    pool = WorkerPool(Endless(), 2, [0, 0], stall_timeout_s=1.0)
    try:
        next(pool), next(pool)
        victim = pool.pids[1]
        os.kill(victim, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(WorkerStalledError) as info:
            for _ in range(10_000):
                next(pool)
        assert time.monotonic() - start < 10
        message = str(info.value)
        assert f"worker 1 of 2 (pid {victim}) made no progress for 1 s" in message
        assert "the process is stopped" in message and "cannot report its stack" in message
        assert pool.broken  # the stopped worker was killed with the others
    finally:
        pool.close()


@pytest.mark.parametrize("how", ["sleep", "deadlock"])
def test_a_worker_stuck_in_a_transform_is_reported_with_its_stack(no_leaks, how):
    it = iter(_prefetched(10, StuckAt(5, how), stall_timeout_s=1.0))
    got = []
    start = time.monotonic()
    with pytest.raises(WorkerStalledError) as info:
        for x in it:
            got.append(x)
    assert time.monotonic() - start < 15
    message = str(info.value)
    # Element 5 is worker 1's (2 workers take elements 1, 3, 5, ...).
    assert "worker 1 of 2 (pid " in message
    assert "transforms.py" in message and "in map" in message  # the stuck transform, from its stack
    assert got == [0, 1, 2, 3, 4]
    # The stopped worker's elements 7, 9 are lost with it: every later call says so.
    with pytest.raises(WorkerStalledError, match=r"cannot go on .*worker 1 of 2"):
        next(it)
    assert it.get_state()["iterators_in_use_states"] == [{"next_index": 3}, {"next_index": 2}]
    it.close()


def test_a_slow_worker_that_keeps_moving_is_not_reported(no_leaks):
    it = iter(_prefetched(4, Spin(1, 2.0), stall_timeout_s=1.0))
    try:
        assert list(it) == [0, 1, 2, 3]
    finally:
        it.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_close_and_get_state_from_another_thread_do_not_wait_behind_a_blocked_next(no_leaks, workers):
    it = iter(_prefetched(6, StuckAt(0), stall_timeout_s=None, workers=workers))
    consumer, outcome = next_in_thread(it)
    time.sleep(1.0)  # next() is now waiting for worker 0, stuck on element 0
    assert consumer.is_alive()
    start = time.monotonic()
    state = it.get_state()
    # Behind the blocked next() it would wait for ever (element 0 never ends).
    assert time.monotonic() - start < 5.0
    assert state["iterators_in_use_states"] == it.get_state()["iterators_in_use_states"]
    assert state["next_index_in_cycle"] == 0
    start = time.monotonic()
    it.close()
    assert time.monotonic() - start < 6.0
    consumer.join(5.0)
    assert not consumer.is_alive()
    assert isinstance(outcome.get("error"), ClosedIteratorError), outcome
    assert "closed" in str(outcome["error"]) and "while next() waited for worker 0" in str(outcome["error"])


def test_a_worker_still_starting_gets_the_startup_time_not_the_stall_timeout():
    # Before its first progress report (a fresh process, imports: slow on a loaded
    # host, where a short stall timeout would report a healthy start) a worker gets
    # STARTUP_TIMEOUT_S; once it has reported, the stall timeout itself.
    assert allowed_stall_s(1.0, 0) == STARTUP_TIMEOUT_S
    assert allowed_stall_s(300.0, 0) == 300.0
    assert allowed_stall_s(1.0, 1) == 1.0


def test_stall_timeout_is_validated():
    with pytest.raises(ValueError, match="stall_timeout_s must be a number of seconds >= 0, or None"):
        MultiprocessingOptions(num_workers=1, stall_timeout_s=-1)
    assert MultiprocessingOptions().stall_timeout_s == 300.0


def test_a_data_loader_reports_a_stuck_worker_after_its_stall_timeout(no_leaks):
    import grainlike as grain

    loader = grain.DataLoader(
        data_source=grain.RangeDataSource(0, 8, 1),
        sampler=grain.IndexSampler(8, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
        operations=[StuckAt(3)],
        worker_count=2,
        stall_timeout_s=1.0,
    )
    assert loader.multiprocessing_options.stall_timeout_s == 1.0
    got = []
    start = time.monotonic()
    with pytest.raises(WorkerStalledError) as info:
        with iter(loader) as it:
            for x in it:
                got.append(int(x))
    assert time.monotonic() - start < 15
    # Record 3 is worker 1's (worker w reads positions w, w + 2, ...).
    assert "worker 1 of 2 (pid " in str(info.value)
    assert got == [0, 1, 2]
    assert grain.WorkerStalledError is WorkerStalledError


def test_a_data_loader_stall_timeout_is_validated():
    import grainlike as grain

    with pytest.raises(ValueError, match="stall_timeout_s must be a number of seconds >= 0"):
        grain.DataLoader(
            data_source=[1, 2],
            sampler=grain.SequentialSampler(2, grain.NoSharding()),
            worker_count=1,
            stall_timeout_s=-5,
        )


@pytest.mark.parametrize("slot", [0, 511, 512, 1023])
def test_a_worker_reports_progress_into_its_slot_beyond_the_first_page(slot):
    # The pool's progress page holds one float64 per worker: more than 512
    # workers take more than one 4 KiB page, and each worker's slot must be mapped.
    from grainlike.workers.liveness import Progress
    from grainlike.workers.main import _Progress

    progress = Progress(1024)
    try:
        _Progress(os.dup(progress.fd), slot)  # (takes the fd: it closes it)
        assert progress.moves(slot) == 1
        assert all(progress.moves(w) == 0 for w in (0, 511, 512, 1023) if w != slot)
    finally:
        progress.close()
