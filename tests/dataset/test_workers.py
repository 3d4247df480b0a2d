"""The worker pool on its own: the task protocol, errors, and process start.

The DataLoader's use of it is tested in tests/loader/test_workers.py, mp_prefetch's
in tests/dataset/test_mp_prefetch.py.
"""

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from grainlike.core.errors import WorkerDiedError
from grainlike.workers.pool import WorkerPool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(60)


class Countdown:
    """Worker ``w`` yields ``(w, i)`` for ``i`` in ``range(state["i"], sizes[w])``."""

    def __init__(self, sizes, fail_at=None, big=False):
        self.sizes = sizes
        self.fail_at = fail_at  # (worker, i) that raises
        self.big = big

    def outputs(self, worker_index, worker_count, state, alloc):
        for i in range(state["i"], self.sizes[worker_index]):
            if (worker_index, i) == self.fail_at:
                raise KeyError(f"element {i} of worker {worker_index}")
            out = (worker_index, i)
            if self.big:
                out = {"id": out, "pixels": np.full((128, 256), worker_index * 100 + i, np.float32)}
            yield {"i": i + 1}, out

    def end_state(self, worker_index, worker_count, state):
        return {**state, "done": True}

    def pickling_error(self, error):
        return error


def _expected(sizes):
    """Round-robin of Countdown(sizes), skipping workers that ended."""
    out, i = [], 0
    while i < max(sizes):
        out += [(w, i) for w, n in enumerate(sizes) if i < n]
        i += 1
    return out


@pytest.mark.parametrize("sizes", [[3], [2, 4], [4, 1, 0]])
def test_outputs_are_round_robin_with_states_after_each(no_leaks, sizes):
    w = len(sizes)
    with WorkerPool(Countdown(sizes), w, [{"i": 0}] * w) as pool:
        got = []
        for out in pool:
            got.append(out)
            owner, i = out
            assert pool.states[owner] == {"i": i + 1}
        assert got == _expected(sizes)
        # Each worker's end state comes from the task.
        assert pool.states == [{"i": n, "done": True} for n in sizes]
        assert all(pool.exhausted)


def test_a_pool_started_from_saved_states_goes_on_from_there(no_leaks):
    sizes = [4, 4]
    with WorkerPool(Countdown(sizes), 2, [{"i": 0}] * 2) as pool:
        head = [next(pool) for _ in range(3)]
        states, next_worker = list(pool.states), pool.next_worker
    with WorkerPool(Countdown(sizes), 2, states, next_worker) as pool:
        assert head + list(pool) == _expected(sizes)


@pytest.mark.parametrize("warm_start", [False, True])
def test_exhausted_workers_are_skipped_and_produce_nothing(no_leaks, warm_start):
    with WorkerPool(
        Countdown([3, 3]), 2, [{"i": 0}, {"i": 1}], 1, exhausted=[False, True], warm_start=warm_start
    ) as pool:
        assert list(pool) == [(0, 0), (0, 1), (0, 2)]
        assert pool.states[1] == {"i": 1}


def test_big_outputs_come_through_shared_memory_and_outlive_the_pool(no_leaks):
    with WorkerPool(Countdown([2, 2], big=True), 2, [{"i": 0}] * 2) as pool:
        outs = list(pool)
    assert [o["id"] for o in outs] == _expected([2, 2])
    for o in outs:
        w, i = o["id"]
        assert o["pixels"].shape == (128, 256) and (o["pixels"] == w * 100 + i).all()
    del outs


def test_an_error_stops_every_worker_by_default(no_leaks):
    pool = WorkerPool(Countdown([3, 3], fail_at=(1, 1)), 2, [{"i": 0}] * 2)
    got = []
    with pytest.raises(KeyError, match="element 1 of worker 1") as info:
        for out in pool:
            got.append(out)
    assert got == [(0, 0), (1, 0), (0, 1)]
    assert "raised in worker 1" in "\n".join(info.value.__notes__)
    assert pool.broken
    # The owner restarts from the states of the last delivered outputs.
    assert pool.states == [{"i": 2}, {"i": 1}] and pool.next_worker == 1


def test_an_error_can_end_only_its_worker(no_leaks):
    with WorkerPool(
        Countdown([4, 4], fail_at=(1, 1)), 2, [{"i": 0}] * 2, error_ends_worker=True
    ) as pool:
        got = [next(pool) for _ in range(3)]
        with pytest.raises(KeyError):
            next(pool)
        # Not yet exhausted: that happens when its turn comes again.
        assert pool.exhausted == [False, False] and pool.next_worker == 1
        got += list(pool)
        assert not pool.broken
        assert pool.states[1] == {"i": 1}
    assert got == [(0, 0), (1, 0), (0, 1), (0, 2), (0, 3)]


class Endless:
    def outputs(self, worker_index, worker_count, state, alloc):
        while True:
            yield state, (worker_index, os.getpid())

    def end_state(self, worker_index, worker_count, state):
        return state

    def pickling_error(self, error):
        return error


def test_a_killed_worker_is_raised_again_at_every_call_when_errors_end_workers(no_leaks):
    with WorkerPool(Endless(), 2, [0, 0], error_ends_worker=True) as pool:
        next(pool), next(pool)
        os.kill(pool.pids[1], signal.SIGKILL)
        # Outputs it sent before it died still come first: small ones travel up
        # to 32 to a message, and a message is buffered on each side.
        with pytest.raises(WorkerDiedError, match=r"worker 1 of 2 .*SIGKILL"):
            for _ in range(300):
                next(pool)
        states = list(pool.states)
        for _ in range(3):
            with pytest.raises(WorkerDiedError, match=r"cannot go on .*grainlike worker 1 of 2"):
                next(pool)
        assert pool.states == states  # Still the state after the last delivered output.


def test_an_unpicklable_task_raises_its_own_error():
    import threading

    class Unpicklable(Countdown):
        def __init__(self):
            super().__init__([1])
            self.lock = threading.Lock()

        def pickling_error(self, error):
            return TypeError(f"the task holds a lock ({error})")

    with pytest.raises(TypeError, match="the task holds a lock"):
        WorkerPool(Unpicklable(), 1, [{"i": 0}])


def _script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _run(args, cwd, timeout=60):
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=str(cwd), timeout=timeout,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert proc.returncode == 0, proc.stderr
    return proc


_UNGUARDED = """
    import os, sys, threading
    import grainlike as grain

    print("top-level ran", flush=True)
    main = sys.modules["__main__"]
    spec = main.__spec__
    failures = []
    stop = threading.Event()

    def watch():
        # The main module's __file__ and __spec__ never change, whichever thread
        # starts workers.
        while not stop.is_set():
            try:
                __file__
            except NameError as e:
                failures.append(repr(e))
            if main.__spec__ is not spec:
                failures.append("__spec__ changed")

    class UsesFile(grain.MapTransform):
        def map(self, x):
            return x * 2 if __file__ else x

    def load(warm_start, out):
        loader = grain.DataLoader(
            data_source=list(range(12)),
            sampler=grain.IndexSampler(12, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
            operations=[UsesFile(), grain.Batch(3)], worker_count=2, warm_start=warm_start)
        with iter(loader) as it:
            out.append(sorted(v for b in it for v in b.tolist()))

    watcher = threading.Thread(target=watch)
    watcher.start()
    outs = []
    starters = [threading.Thread(target=load, args=(w, outs)) for w in (True, False, True)]
    for t in starters:
        t.start()
    load(True, outs)
    for t in starters:
        t.join()
    stop.set()
    watcher.join()
    assert not failures, failures[:3]
    assert outs == [[2 * i for i in range(12)]] * 4, outs
    print("ok", flush=True)
"""


def test_main_module_stays_intact_while_workers_start_from_several_threads(tmp_path):
    script = _script(tmp_path, "unguarded.py", _UNGUARDED)
    proc = _run([str(script)], tmp_path)
    assert proc.stdout.count("top-level ran") == 1
    assert "ok" in proc.stdout


def test_unguarded_module_run_with_dash_m_does_not_run_again_in_workers(tmp_path):
    _script(tmp_path, "unguarded_mod.py", _UNGUARDED)
    proc = _run(["-m", "unguarded_mod"], tmp_path)
    assert proc.stdout.count("top-level ran") == 1
    assert "ok" in proc.stdout


def test_a_held_worker_killed_after_it_reported_ready_is_raised_at_every_call(no_leaks):
    from tests.helpers import leaks

    with WorkerPool(Countdown([6, 6]), 2, [{"i": 0}, {"i": 0}], warm_start=True, error_ends_worker=True) as pool:
        got = [next(pool)]  # Starts both workers held; this output is computed here.
        sd = pool._shutdown
        assert leaks.wait_until(
            lambda: sd.launched == 2 and all(sd.results[w].poll() for w in range(2)), timeout=30
        )
        victim = pool.pids[1]
        os.kill(victim, signal.SIGKILL)
        assert leaks.wait_until(lambda: leaks.process_ended(victim))
        with pytest.raises(WorkerDiedError, match=rf"worker 1 of 2 \(pid {victim}\) .*SIGKILL"):
            next(pool)
        # Worker 1's outputs are lost with it: every later call says so.
        with pytest.raises(WorkerDiedError, match=rf"cannot go on .*grainlike worker 1 of 2 \(pid {victim}\)"):
            next(pool)
        assert pool.states[1] == {"i": 0}


class FailsToLoad(Countdown):
    """A Countdown that cannot be unpickled, i.e. loaded in a worker."""

    def __setstate__(self, state):
        raise KeyError("this task cannot be loaded in a worker")


def test_held_workers_that_fail_to_load_report_once_each_when_errors_end_workers(no_leaks):
    from tests.helpers import leaks

    with WorkerPool(FailsToLoad([6, 6]), 2, [{"i": 0}, {"i": 0}], warm_start=True, error_ends_worker=True) as pool:
        assert next(pool) == (0, 0)  # Computed here while the workers start.
        sd = pool._shutdown
        assert leaks.wait_until(
            lambda: sd.launched == 2 and all(sd.results[w].poll() for w in range(2)), timeout=30
        )
        for w in range(2):
            with pytest.raises(KeyError, match="cannot be loaded") as info:
                next(pool)
            assert any(f"raised in worker {w} " in n for n in getattr(info.value, "__notes__", [])), info.value
        with pytest.raises(StopIteration):
            next(pool)
