"""DeviceIterator: batches on JAX devices, prefetch, state, buffer safety, cleanup."""

from __future__ import annotations

import functools
import gc
import threading
from multiprocessing import shared_memory

import jax
import numpy as np
import pytest

import grainlike as grain
from grainlike.dataset.conformance import assert_equal_output_after_checkpoint
from grainlike.jax.device_iterator import DeviceIterator, make_global_batch
from tests.helpers.leaks import wait_until

pytestmark = pytest.mark.timeout(60)

WORKERS = [0, 2]
DIM = 8192  # 128 KiB batches: above the inline limit, so workers use shared memory


def make_loader(worker_count=0, num_records=40, batch_size=4, seed=3):
    # Defined in here so cloudpickle ships it by value: a worker would otherwise
    # import this module, and with it jax.
    class Features(grain.MapTransform):
        def map(self, x):
            # 128 KiB per batch: worker batches travel in shared memory.
            return {"id": np.int64(x), "x": np.full((DIM,), x, np.float32), "name": f"r{x}"}

    return grain.DataLoader(
        data_source=list(range(num_records)),
        sampler=grain.IndexSampler(
            num_records, grain.NoSharding(), shuffle=True, num_epochs=1, seed=seed
        ),
        operations=[Features(), grain.Batch(batch_size)],
        worker_count=worker_count,
    )


@functools.lru_cache(maxsize=None)
def reference(worker_count):
    """One plain run: the batches' ids, and the state after each batch (index k)."""
    with iter(make_loader(worker_count)) as it:
        states = [it.get_state()]
        batch_ids = []
        for b in it:
            batch_ids.append(b["id"].tolist())
            states.append(it.get_state())
    return batch_ids, states


def ids(batches):
    return [np.asarray(b["id"]).tolist() for b in batches]


def device_threads():
    return [t for t in threading.enumerate() if t.name == "grainlike-device-prefetch"]


@pytest.mark.parametrize("worker_count", WORKERS)
@pytest.mark.parametrize("prefetch", [0, 2])
def test_yields_the_loaders_batches_intact_as_jax_arrays(worker_count, prefetch, no_leaks):
    # All batches are kept while the loader runs on (and reuses shared memory).
    with DeviceIterator(iter(make_loader(worker_count)), prefetch=prefetch) as it:
        got = list(it)
    assert ids(got) == reference(worker_count)[0]
    for g in got:
        assert isinstance(g["x"], jax.Array) and isinstance(g["id"], jax.Array)
        np.testing.assert_array_equal(
            np.asarray(g["x"]), np.repeat(np.asarray(g["id"], np.float32)[:, None], DIM, 1)
        )
        # Strings cannot live on a device; they stay numpy.
        assert isinstance(g["name"], np.ndarray)
        assert g["name"].tolist() == [f"r{i}" for i in g["id"].tolist()]


@pytest.mark.parametrize("worker_count", WORKERS)
@pytest.mark.parametrize("k,prefetch", [(0, 3), (1, 1), (4, 3), (10, 2)])
def test_state_is_after_last_batch_handed_out(worker_count, prefetch, k):
    expected, states = reference(worker_count)

    with DeviceIterator(iter(make_loader(worker_count)), prefetch=prefetch) as it:
        head = [next(it) for _ in range(k)]
        state = it.get_state()
        rest = list(it)
    assert ids(head) == expected[:k]
    assert ids(rest) == expected[k:]
    # The same JSON the plain iterator has after k batches.
    assert state == states[k]


class OnDevice:
    """A loader whose iterators are DeviceIterators."""

    def __init__(self, worker_count, prefetch):
        self.loader = make_loader(worker_count, num_records=24)
        self.prefetch = prefetch

    def __iter__(self):
        return DeviceIterator(iter(self.loader), prefetch=self.prefetch)


@pytest.mark.parametrize("worker_count", WORKERS)
@pytest.mark.parametrize("prefetch", [1, 3])
def test_restores_at_every_step_with_batches_prefetched(worker_count, prefetch, no_leaks):
    assert_equal_output_after_checkpoint(OnDevice(worker_count, prefetch))


@pytest.mark.parametrize("worker_count", WORKERS)
def test_set_state_on_a_running_iterator_drops_prefetched_batches(worker_count):
    expected = reference(worker_count)[0]
    with DeviceIterator(iter(make_loader(worker_count)), prefetch=3) as it:
        next(it), next(it)
        saved = it.get_state()
        for _ in range(3):
            next(it)
        it.set_state(saved)
        assert ids(list(it)) == expected[2:]


@pytest.mark.parametrize("worker_count", WORKERS)
def test_invalid_state_changes_nothing(worker_count):
    expected = reference(worker_count)[0]
    wrong = reference(worker_count)[1][1].replace(b"seed=3", b"seed=99")
    with DeviceIterator(iter(make_loader(worker_count)), prefetch=3) as it:
        next(it)
        with pytest.raises(grain.InvalidStateError, match="Sampler in checkpoint"):
            it.set_state(wrong)
        assert ids(list(it)) == expected[1:]


@pytest.mark.parametrize("worker_count", WORKERS)
def test_close_and_garbage_collection_stop_the_thread(worker_count, no_leaks):
    it = DeviceIterator(iter(make_loader(worker_count)), prefetch=2)
    next(it)
    assert len(device_threads()) == 1
    it.close()
    assert device_threads() == []
    it.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        next(it)

    it = DeviceIterator(iter(make_loader(worker_count)), prefetch=2)
    next(it)
    del it
    gc.collect()
    # The finalizer does not wait: the thread ends once the batch it is reading is read.
    assert wait_until(lambda: device_threads() == [], timeout=2.0)


def test_error_in_the_wrapped_iterator_is_raised_in_order_and_iteration_goes_on():
    class Flaky:
        def __init__(self):
            self.i = 0

        def __iter__(self):
            return self

        def __next__(self):
            self.i += 1
            if self.i == 3:
                raise KeyError("record 3 is broken")
            if self.i > 5:
                raise StopIteration
            return np.full((4,), self.i)

    with DeviceIterator(Flaky(), prefetch=4) as it:
        got = [int(next(it)[0]), int(next(it)[0])]
        with pytest.raises(KeyError, match="record 3 is broken"):
            next(it)
        got += [int(b[0]) for b in it]
    assert got == [1, 2, 4, 5]
    with pytest.raises(TypeError, match="has no get_state"):
        DeviceIterator(Flaky()).get_state()


def test_shared_memory_batch_is_copied_before_jax_can_alias_it():
    # A batch that is a view of shared memory, as batches from workers are.
    shm = shared_memory.SharedMemory(create=True, size=1 << 16)
    try:
        view = np.ndarray((1 << 14,), np.float32, buffer=shm.buf)
        view[:] = 1.0
        with DeviceIterator(iter([{"x": view}]), prefetch=0) as it:
            batch = next(it)
        # The loader reuses the segment for a later batch, then frees it.
        view[:] = 7.0
        del view
    finally:
        shm.close()
        shm.unlink()
    np.testing.assert_array_equal(np.asarray(batch["x"]), np.ones(1 << 14, np.float32))


def test_copy_true_protects_a_buffer_the_iterator_refills():
    buffer = np.zeros((1024,), np.float32)  # owns its data: not copied by default

    def refilling():
        for i in range(3):
            buffer[:] = i
            yield buffer

    with DeviceIterator(refilling(), prefetch=0, copy=True) as it:
        got = [next(it) for _ in range(3)]
    assert [float(g[0]) for g in got] == [0.0, 1.0, 2.0]


def test_sharding_and_mesh_place_batches():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    for where in (mesh, sharding, jax.devices()[0]):
        with DeviceIterator(iter(make_loader(0)), where) as it:
            batch = next(it)
        assert batch["x"].shape == (4, DIM)
        assert batch["x"].sharding.device_set == {jax.devices()[0]}
    with pytest.raises(TypeError, match="sharding must be"):
        DeviceIterator(iter(make_loader(0)), "cpu")
    with pytest.raises(ValueError, match="prefetch must be"):
        DeviceIterator(iter(make_loader(0)), prefetch=-1)


def test_make_global_batch_in_one_process_is_the_local_batch():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    local = next(iter(make_loader(0)))
    batch = make_global_batch(local, mesh)
    assert isinstance(batch["x"], jax.Array) and batch["x"].shape == local["x"].shape
    np.testing.assert_array_equal(np.asarray(batch["x"]), local["x"])
    with pytest.raises(TypeError, match="make_global_batch needs"):
        make_global_batch(local, None)
