"""Warm start: the calling process computes the first outputs while workers start.

The outputs, their order and every state must be exactly those of the workers
alone; the hand-over to each worker happens when it has loaded its pipeline.
"""

import os
import signal
import time

import numpy as np
import pytest

import grainlike as grain
from grainlike.core.errors import WorkerDiedError
from tests.helpers import leaks
from tests.loader.test_workers import FailAt

pytestmark = pytest.mark.timeout(60)


class SlowToLoad:
    """A list source that takes ``delay`` seconds to unpickle, i.e. in each worker."""

    def __init__(self, n: int, delay: float):
        self.items = list(range(n))
        self.delay = delay

    def __len__(self):
        return len(self.items)

    def __getitem__(self, key):
        return self.items[key]

    def __setstate__(self, state):
        time.sleep(state["delay"])
        self.__dict__.update(state)

    def __repr__(self):
        return f"SlowToLoad(n={len(self.items)})"


class WithPid(grain.MapTransform):
    def map(self, x):
        return {"x": x, "pid": os.getpid()}


class Noise(grain.RandomMapTransform):
    def random_map(self, x, rng):
        return {**x, "noise": rng.integers(0, 2**31)}


class DropMultiplesOf5(grain.FilterTransform):
    def filter(self, x):
        return x["x"] % 5 != 0


def _loader(source, ops, workers=2, warm_start=True, epochs=1):
    n = len(source)
    return grain.DataLoader(
        data_source=source,
        sampler=grain.IndexSampler(n, grain.NoSharding(), shuffle=True, num_epochs=epochs, seed=5),
        operations=ops,
        worker_count=workers,
        warm_start=warm_start,
    )


def _ops():
    return [WithPid(), Noise(), DropMultiplesOf5(), grain.Batch(3)]


def _plain(batch):
    return {k: v.tolist() for k, v in batch.items() if k != "pid"}


def _wait_all_ready(it, workers):
    """Waits until every held worker has reported that its pipeline is loaded."""
    sd = it._stream._shutdown
    assert leaks.wait_until(
        lambda: sd.launched == workers and all(sd.results[w].poll() for w in range(workers)),
        timeout=30,
    )


def _reference(source, ops, workers):
    """(output, state after it) for every step, without warm start."""
    with iter(_loader(source, ops, workers, warm_start=False, epochs=2)) as it:
        out = []
        for batch in it:
            out.append((_plain(batch), it.get_state()))
        return out


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_first_outputs_come_from_the_calling_process_then_from_the_workers(no_leaks, workers):
    source = SlowToLoad(60, delay=1.5)
    expected = _reference(SlowToLoad(60, delay=0), _ops(), workers)
    with iter(_loader(source, _ops(), workers, epochs=2)) as it:
        got, early = [], []
        for _ in range(2 * workers):
            early.append(next(it))
            got.append((_plain(early[-1]), it.get_state()))
        assert all((b["pid"] == os.getpid()).all() for b in early)
        _wait_all_ready(it, workers)
        late = []
        for batch in it:
            late.append(batch)
            got.append((_plain(batch), it.get_state()))
        # After the hand-over every output was made by a worker process.
        assert late and all((b["pid"] != os.getpid()).all() for b in late)
    assert got == expected


def test_states_during_warm_start_are_the_workers_states_and_restore(no_leaks):
    expected = _reference(SlowToLoad(60, delay=0), _ops(), 2)
    loader = _loader(SlowToLoad(60, delay=2.0), _ops(), 2, epochs=2)
    with iter(loader) as it:
        for step in range(5):
            batch = next(it)
            assert (batch["pid"] == os.getpid()).all()
            assert (_plain(batch), it.get_state()) == expected[step]
        state = it.get_state()
    # Restored in a loader without warm start: the workers go on where it stopped.
    with iter(_loader(SlowToLoad(60, delay=0), _ops(), 2, warm_start=False, epochs=2)) as it:
        it.set_state(state)
        assert [_plain(b) for b in it] == [e for e, _ in expected[5:]]


def test_the_end_of_the_data_during_warm_start_matches_the_workers(no_leaks):
    # 10 records end before the workers have started: the stream ends in process.
    expected = _reference(SlowToLoad(10, delay=0), _ops(), 2)
    with iter(_loader(SlowToLoad(10, delay=3.0), _ops(), 2, epochs=2)) as it:
        got = [(_plain(b), it.get_state()) for b in it]
        end_state = it.get_state()
    assert got == expected
    assert end_state == expected[-1][1]


def test_an_error_during_warm_start_names_record_transform_and_process(no_leaks):
    loader = _loader(SlowToLoad(20, delay=2.0), [FailAt(7)], 2)
    with iter(loader) as it:
        got = []
        with pytest.raises(KeyError) as info:
            while True:
                got.append(next(it))
    notes = "\n".join(info.value.__notes__)
    assert "FailAt" in notes and "record_key 7" in notes
    assert "raised in the calling process" in notes and "warm_start=False" in notes
    # Everything before the bad record was delivered, in the workers' order.
    with iter(_loader(SlowToLoad(20, delay=0), [FailAt(7)], 2, warm_start=False)) as ref:
        expected = []
        with pytest.raises(KeyError):
            while True:
                expected.append(next(ref))
    assert got == expected


def test_a_worker_killed_while_it_starts_is_reported_and_next_resumes(no_leaks):
    ops = [WithPid(), grain.Batch(2)]
    expected = [_plain(b) for b in _loader(SlowToLoad(40, delay=0), ops, 2, warm_start=False)]
    it = iter(_loader(SlowToLoad(40, delay=3.0), ops, 2))
    got = [_plain(next(it))]
    sd = it._stream._shutdown
    assert leaks.wait_until(lambda: sd.launched == 2, timeout=30)
    victim = it._stream.pids[1]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 10
    with pytest.raises(WorkerDiedError, match=r"worker 1 of 2 .*SIGKILL"):
        while time.monotonic() < deadline:
            got.append(_plain(next(it)))
            time.sleep(0.01)
    assert leaks.wait_until(lambda: leaks.process_ended(victim))
    got.extend(_plain(b) for b in it)
    assert got == expected
    it.close()


def test_start_prefetch_starts_workers_that_compute_everything(no_leaks):
    with iter(_loader(SlowToLoad(30, delay=0.5), [WithPid(), grain.Batch(2)], 2)) as it:
        it.start_prefetch()
        assert all((b["pid"] != os.getpid()).all() for b in it)


@pytest.mark.parametrize("explicit", [True, False], ids=["warm_start=False", "default"])
def test_without_warm_start_no_transform_runs_in_the_calling_process(no_leaks, explicit):
    source, ops = SlowToLoad(30, delay=0.5), [WithPid(), grain.Batch(2)]
    if explicit:
        loader = _loader(source, ops, 2, warm_start=False)
    else:
        loader = grain.DataLoader(
            data_source=source,
            sampler=grain.IndexSampler(30, grain.NoSharding(), shuffle=True, num_epochs=1, seed=5),
            operations=ops,
            worker_count=2,
        )
        assert loader.multiprocessing_options.warm_start is False
    pids = {int(p) for b in loader for p in np.asarray(b["pid"]).ravel()}
    assert pids and os.getpid() not in pids


def test_a_worker_killed_after_it_reported_ready_is_reported_by_name(no_leaks):
    ops = [WithPid(), grain.Batch(2)]
    expected = [_plain(b) for b in _loader(SlowToLoad(40, delay=0), ops, 2, warm_start=False)]
    it = iter(_loader(SlowToLoad(40, delay=0), ops, 2))
    got = [_plain(next(it))]
    # Both workers have loaded their pipeline and wait to be told to start; one
    # dies before the next call hands its task over.
    _wait_all_ready(it, 2)
    victim = it._stream.pids[1]
    os.kill(victim, signal.SIGKILL)
    assert leaks.wait_until(lambda: leaks.process_ended(victim))
    with pytest.raises(WorkerDiedError, match=rf"worker 1 of 2 \(pid {victim}\) .*SIGKILL"):
        next(it)
    got.extend(_plain(b) for b in it)
    assert got == expected
    it.close()
