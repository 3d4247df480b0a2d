"""grainlike.ray.prefetch on a local Ray instance (loopback only, 2 CPUs): mp_prefetch's
elements, order and states, restores both ways and onto other worker counts, a
SIGKILLed actor restarted with every element once, nothing left after close."""

from __future__ import annotations

import collections
import contextlib
import gc
import os
import signal
import threading
import time

import numpy as np
import pytest

from tests.ray.conftest import (
    N,
    actor_dead,
    actor_names,
    mp_reference,
    object_store_objects,
    pipeline,
    run,
    values,
    wait_until,
)

ray = pytest.importorskip("ray", reason="grainlike.ray needs Ray (the ray extra)")

import grainlike as grain  # noqa: E402
import grainlike.ray as grain_ray  # noqa: E402

# A Ray instance on a loaded 2-core machine starts its actors slowly (the first
# next() waits for two worker processes to start and import grainlike).
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One Ray instance for the module, bound to 127.0.0.1, without a dashboard."""
    if ray.is_initialized():
        ray.shutdown()
    grain_ray.init_local(num_cpus=2, object_store_memory=150 << 20, log_to_driver=False)
    try:
        yield
    finally:
        # Handles and object refs go while their session lives: a later session
        # in this process reuses the same ids.
        gc.collect()
        ray.shutdown()


def test_local_instance_listens_on_loopback_only():
    assert ray.util.get_node_ip_address() == "127.0.0.1"
    assert all(n["NodeManagerAddress"] == "127.0.0.1" for n in ray.nodes())


def test_same_elements_order_and_state_at_every_step_as_mp_prefetch():
    ds = pipeline(big=True)
    expected = mp_reference(ds, 2)
    with contextlib.closing(iter(grain_ray.prefetch(ds, 2))) as it:
        first = next(it)
        first_state = it.get_state()
        # Arrays come as mp_prefetch delivers them (SharedMemoryArrays), mapped from
        # Ray's object store without a copy: read-only views of its immutable objects.
        assert type(first["big"]) is grain.SharedMemoryArray
        assert not first["big"].flags.writeable and not first["big"].flags.owndata
        rest, rest_states = run(it)
    assert [values(first)] + rest == expected[0]
    assert [first_state] + rest_states == expected[1]


def test_state_of_mp_prefetch_restores_on_ray_and_back():
    ds = pipeline()
    full, states = mp_reference(ds, 2)
    # mp_prefetch -> Ray, mid-epoch.
    with contextlib.closing(iter(grain_ray.prefetch(ds, 2))) as it:
        it.set_state(states[4])
        rest, rest_states = run(it, 3)
        assert rest == full[5:8] and rest_states == states[5:8]
        ray_state = it.get_state()
    # Ray -> mp_prefetch.
    assert mp_reference(ds, 2, ray_state) == (full[8:], states[8:])


def test_set_state_on_a_running_iterator_moves_its_actors_back():
    ds = pipeline()
    full, states = mp_reference(ds, 2)
    with contextlib.closing(iter(grain_ray.prefetch(ds, 2))) as it:
        run(it, 6)
        pool = it._pool
        pids = {w: ray.get(a.where.remote())[0] for w, a in pool.actors.items()}
        it.set_state(states[1])  # what the actors computed ahead is dropped
        again, again_states = run(it, 2)
        # The same actors go on from the new state.
        assert it._pool is pool and pool.restarts == 0
        assert {w: ray.get(a.where.remote())[0] for w, a in pool.actors.items()} == pids
        rest, rest_states = run(it)
    assert (again + rest, again_states + rest_states) == (full[2:], states[2:])


@pytest.mark.parametrize("old, new", [(2, 1), (1, 2)])
def test_state_restores_on_another_worker_count_every_element_once(old, new):
    ds = pipeline()
    everything = collections.Counter(x for x in range(N) if x % 7 != 3)  # pipeline()'s filter
    with contextlib.closing(iter(grain_ray.prefetch(ds, old))) as it:
        before, _ = run(it, 3)
        state = it.get_state()
    # Restored on the other count, one side on Ray, the other on mp_prefetch: both ways.
    with contextlib.closing(iter(grain_ray.prefetch(ds, new))) as it:
        it.set_state(state)
        after, _ = run(it)
    assert collections.Counter(v for b in before + after for v in b) == everything
    assert mp_reference(ds, new, state)[0] == after


def test_killed_actor_restarts_from_its_last_delivered_element():
    ds = pipeline(big=True)
    expected, expected_states = mp_reference(ds, 2)
    with contextlib.closing(iter(grain_ray.prefetch(ds, 2))) as it:
        got, got_states = run(it, 3)
        pool = it._pool
        pid, _ = ray.get(pool.actors[1].where.remote())
        os.kill(pid, signal.SIGKILL)
        rest, rest_states = run(it)
        assert pool.restarts >= 1
    assert got + rest == expected
    assert got_states + rest_states == expected_states


def test_close_kills_every_actor_and_frees_its_objects():
    with contextlib.closing(iter(grain_ray.prefetch(pipeline(n=600, big=True), 2))) as it:
        next(it)
        assert object_store_objects() > 0  # the pipeline, and results of calls in flight
        prefix = it._pool.name_prefix
        handles = list(it._pool.actors.values())
        assert len(handles) == 2 and len(actor_names(ray, prefix)) == 2
    assert all(actor_dead(ray, h) for h in handles)
    assert wait_until(lambda: not actor_names(ray, prefix))
    assert wait_until(lambda: object_store_objects() == 0)


def test_dropped_iterator_kills_its_actors_and_frees_its_objects():
    it = iter(grain_ray.prefetch(pipeline(n=600, big=True), 2))
    next(it)
    prefix = it._pool.name_prefix
    handles = list(it._pool.actors.values())
    del it
    gc.collect()
    assert all(actor_dead(ray, h) for h in handles)
    assert wait_until(lambda: not actor_names(ray, prefix))
    assert wait_until(lambda: object_store_objects() == 0)


def test_error_in_a_transform_is_raised_once_with_its_type_then_the_others_go_on():
    def fail_on_7(x):
        if x == 7:
            raise KeyError("no 7")
        return x

    ds = grain.MapDataset.range(12).to_iter_dataset().map(fail_on_7)
    for make in (lambda: ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2)), lambda: grain_ray.prefetch(ds, 2)):
        with contextlib.closing(iter(make())) as it:
            got = []
            while True:
                try:
                    got.append(next(it))
                except KeyError as e:
                    assert "no 7" in str(e)
                    got.append("error")
                except StopIteration:
                    break
        # As mp_prefetch (and grain): worker 1 ends at its error, worker 0 goes on.
        assert got == [0, 1, 2, 3, 4, 5, 6, "error", 8, 10], make


def test_first_call_returns_one_element_and_calls_in_flight_bound_the_work_ahead(tmp_path):
    log = str(tmp_path / "computed")

    def record(x):
        with open(log, "a") as f:
            f.write(f"{x}\n")
        return x

    ds = grain.MapDataset.range(200).to_iter_dataset().map(record)
    with contextlib.closing(iter(grain_ray.prefetch(ds, 1, elements_per_call=4, calls_in_flight=2))) as it:
        assert next(it) == 0
        time.sleep(1.5)  # the actor would run ahead here without backpressure
        with open(log) as f:
            computed = len(f.read().split())
    # The first call returned 1 element; two calls of 2 and 4 are outstanding.
    assert computed <= 1 + 2 + 4, computed


# -- the DataLoader ------------------------------------------------------------------


def _loader(workers: int = 2):
    class _Square(grain.MapTransform):  # defined here: it travels by value
        def map(self, x):
            return {"x": np.int64(x), "sq": np.full((3,), x * x, np.int64)}

    return grain.DataLoader(
        data_source=grain.RangeDataSource(0, 40, 1),
        sampler=grain.IndexSampler(40, grain.NoSharding(), shuffle=True, num_epochs=1, seed=3),
        operations=[_Square(), grain.Batch(4)],
        worker_count=workers,
    )


def _loader_run(it, steps=None) -> tuple[list, list]:
    out, states = [], []
    while steps is None or len(out) < steps:
        try:
            batch = next(it)
        except StopIteration:
            break
        out.append((batch["x"].tolist(), batch["sq"].tolist()))
        states.append(it.get_state())
    return out, states


def test_data_loader_on_ray_same_batches_and_state_as_its_worker_processes():
    loader = _loader()
    with contextlib.closing(iter(loader)) as it:
        expected = _loader_run(it)
    with contextlib.closing(grain_ray.data_loader_iter(loader)) as it:
        assert _loader_run(it) == expected


def test_data_loader_state_restores_from_worker_processes_on_ray_and_back():
    loader = _loader()
    with contextlib.closing(iter(loader)) as it:
        full, states = _loader_run(it)
    with contextlib.closing(grain_ray.data_loader_iter(loader)) as it:
        it.set_state(states[2])
        assert _loader_run(it, 3) == (full[3:6], states[3:6])
        saved = it.get_state()
    with contextlib.closing(iter(loader)) as it:
        it.set_state(saved)
        assert _loader_run(it) == (full[6:], states[6:])


def test_data_loader_without_workers_is_refused():
    with pytest.raises(ValueError, match="worker_count=0"):
        grain_ray.data_loader_iter(_loader(workers=0))


def test_handles_of_another_ray_session_are_not_killed():
    # Ray reuses actor ids from one session to the next in a process: a pool
    # dropped after ray.shutdown() and ray.init() must not kill today's actor
    # that has its old actor's id.
    from grainlike.ray.pool import _Actors, _kill_all

    with contextlib.closing(iter(grain_ray.prefetch(pipeline(n=600), 1))) as it:
        next(it)
        handle = it._pool.actors[0]
        stale = _Actors()
        stale.handles[0], stale.session = handle, ("127.0.0.1:1", "a node of an ended session")
        _kill_all(stale)
        assert not actor_dead(ray, handle, timeout=2.0)
        assert next(it) is not None


def test_an_output_that_cannot_be_sent_is_raised_after_the_outputs_before_it():
    def lock_at_9(x):
        return threading.Lock() if x == 9 else x

    ds = grain.MapDataset.range(16).to_iter_dataset().map(lock_at_9)
    results = []
    for make in (lambda: ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2)), lambda: grain_ray.prefetch(ds, 2)):
        with contextlib.closing(iter(make())) as it:
            got = []
            while True:
                try:
                    got.append(next(it))
                except TypeError as e:
                    assert "pickle" in str(e)
                    got.append("error")
                except StopIteration:
                    break
        results.append(got)
    # Worker 1's call holding 7 and 9 cannot be sent; 7 is still delivered, then the error.
    assert results[1] == results[0] == [0, 1, 2, 3, 4, 5, 6, 7, 8, "error", 10, 12, 14]
