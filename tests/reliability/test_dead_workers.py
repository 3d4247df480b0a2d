"""A worker that dies: never a silently short epoch, and nothing lost on restore.

grain 0.2.18's ``mp_prefetch`` raises ``RuntimeError`` once for a dead worker and
then ends the iteration without that worker's remaining elements. grainlike
raises ``WorkerDiedError`` (a ``RuntimeError``) at every later ``next()``;
``get_state()`` stays the state after the last delivered element.
"""

import os
import signal

import pytest

from grainlike.dataset import MapDataset
from grainlike.dataset.nodes.options import MultiprocessingOptions
from grainlike.core.errors import WorkerDiedError
from tests.helpers import leaks

pytestmark = pytest.mark.timeout(120)

N = 3000


def _dataset(workers=3):
    return MapDataset.range(N).to_iter_dataset().mp_prefetch(MultiprocessingOptions(num_workers=workers))


def _until_error(it, got):
    with pytest.raises(WorkerDiedError) as info:
        while True:
            got.append(next(it))
    return info.value


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV], ids=["SIGKILL", "SIGSEGV"])
@pytest.mark.parametrize("delivered", [0, 1, 100, 1501])
def test_after_a_worker_dies_every_next_raises_and_its_state_restores_the_rest(no_leaks, sig, delivered):
    it = iter(_dataset())
    got = [next(it) for _ in range(max(delivered, 1))]
    victim = it._pool.pids[1]
    os.kill(victim, sig)
    assert leaks.wait_until(lambda: leaks.process_ended(victim), timeout=10)
    first = _until_error(it, got)
    assert f"worker 1 of 3 (pid {victim})" in str(first) and sig.name in str(first)
    # Every later call raises again, naming the worker: the epoch never ends short.
    for _ in range(3):
        with pytest.raises(WorkerDiedError, match=rf"cannot go on .*worker 1 of 3 \(pid {victim}\)"):
            next(it)
    state = it.get_state()
    it.close()
    fresh = iter(_dataset())
    fresh.set_state(state)
    rest = list(fresh)
    fresh.close()
    assert got + rest == list(range(N))


def test_a_dead_worker_state_restores_onto_two_workers(no_leaks):
    it = iter(_dataset())
    got = [next(it) for _ in range(50)]
    os.kill(it._pool.pids[2], signal.SIGKILL)
    _until_error(it, got)
    state = it.get_state()
    it.close()
    fresh = iter(_dataset(2))
    fresh.set_state(state)
    rest = list(fresh)
    fresh.close()
    assert sorted(got + rest) == list(range(N))


def test_restart_dead_workers_delivers_every_element_once_through_kills_at_many_points(no_leaks):
    options = MultiprocessingOptions(num_workers=3, restart_dead_workers=True)
    it = iter(MapDataset.range(N).to_iter_dataset().mp_prefetch(options))
    kills = {0: 0, 1: 1, 7: 2, 100: 0, 101: 1, 1500: 2, 2990: 0, 2999: 1}
    got, killed, seen = [], set(), set()
    for i in range(N):
        if i in kills:
            pids = it._pool.pids if it._pool is not None and it._pool.pids else None
            if pids:
                os.kill(pids[kills[i]], signal.SIGKILL)
                killed.add(pids[kills[i]])
        got.append(next(it))
        seen.update(it._pool.pids)
    with pytest.raises(StopIteration):
        next(it)
    it.close()
    assert got == list(range(N))
    assert len(killed) >= 6 and len(seen) >= 3 + 6  # the killed workers were replaced


def test_restart_dead_workers_stays_out_of_the_repr_as_in_grain():
    assert repr(MultiprocessingOptions(2, restart_dead_workers=True)) == repr(MultiprocessingOptions(2))
    with pytest.raises(ValueError, match="restart_dead_workers must be True or False, got 1"):
        MultiprocessingOptions(2, restart_dead_workers=1)
