"""Iterators shared between threads: each element once, no internal error, consistent states.

Eight threads call ``next()`` on one iterator of each kind (the DataLoader's,
``mp_prefetch``, thread prefetch, read prefetch, the device iterator; without
and with 2 workers) until ``StopIteration``, while another thread takes states.
Every element must be delivered exactly once, and every state taken must be the
state after some delivered element: restored in a fresh iterator, it yields a
suffix of the sequential order.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import grainlike as grain
from grainlike.dataset import MapDataset
from grainlike.dataset.nodes.options import MultiprocessingOptions
from grainlike.dataset.transformations.thread_prefetch import ThreadPrefetchIterDataset

pytestmark = pytest.mark.timeout(240)

N = 400
THREADS = 8


def _key(x):
    """A hashable element id: ints stay ints, batches become their first id."""
    if isinstance(x, dict):
        x = x["id"]
    a = np.asarray(x)
    return int(a.ravel()[0]) if a.ndim else int(a)


def _dataset(kind, workers):
    ds = MapDataset.range(N).map(lambda x: x * 3)
    if kind == "read_prefetch":
        ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=4, prefetch_buffer_size=16))
    else:
        ds = ds.to_iter_dataset()
    if workers:
        ds = ds.mp_prefetch(MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=4))
    if kind == "thread_prefetch":
        ds = ThreadPrefetchIterDataset(ds, prefetch_buffer_size=8)
    return ds


class _Source:
    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"id": np.int64(i * 3)}

    def __repr__(self):
        return f"_Source({N})"


def _loader(workers):
    return grain.DataLoader(
        data_source=_Source(),
        sampler=grain.SequentialSampler(N, grain.NoSharding()),
        operations=[grain.Batch(2)],
        worker_count=workers,
    )


def _hammer(it):
    """``THREADS`` threads drain ``it``; a state-taker runs beside them. Returns (keys, errors, states)."""
    got, errors, states = [], [], []
    done = threading.Event()

    def drain():
        mine = []
        try:
            while True:
                try:
                    x = next(it)
                except StopIteration:
                    break
                mine.append(_key(x))
        except BaseException as e:  # noqa: B902 - reported to the test
            errors.append(e)
        got.extend(mine)

    def take_states():
        while not done.wait(0.002) and len(states) < 200:
            try:
                states.append(it.get_state())
            except BaseException as e:  # noqa: B902 - reported to the test
                errors.append(e)
                return

    taker = threading.Thread(target=take_states)
    taker.start()
    threads = [threading.Thread(target=drain) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    done.set()
    taker.join(10)
    return got, errors, states


def _check_states(states, make, expected):
    """Each sampled state restores to a suffix of ``expected`` (the sequential order)."""
    picks = [states[i] for i in np.linspace(0, len(states) - 1, num=min(4, len(states))).astype(int)]
    for state in picks:
        fresh = make()
        try:
            fresh.set_state(state)
            rest = [_key(x) for x in fresh]
        finally:
            fresh.close()
        assert rest == expected[len(expected) - len(rest):], "a state taken during next() is not one after a delivered element"


@pytest.mark.parametrize(
    "kind, workers",
    [("mp_prefetch", 2), ("thread_prefetch", 0), ("thread_prefetch", 2), ("read_prefetch", 0), ("read_prefetch", 2)],
)
def test_a_dataset_iterator_shared_by_eight_threads_delivers_each_element_once(no_leaks, kind, workers):
    expected = [x * 3 for x in range(N)]
    it = iter(_dataset(kind, workers))
    try:
        got, errors, states = _hammer(it)
    finally:
        it.close()
    assert not errors, errors[:3]
    assert sorted(got) == expected
    _check_states(states, lambda: iter(_dataset(kind, workers)), expected)


def _loader_order(workers):
    """The first ids of the loader's batches, in order, read by one thread."""
    with iter(_loader(workers)) as it:
        return [_key(b) for b in it]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataloader_iterator_shared_by_eight_threads_delivers_each_batch_once(no_leaks, workers):
    expected = _loader_order(workers)
    it = iter(_loader(workers))
    try:
        got, errors, states = _hammer(it)
    finally:
        it.close()
    assert not errors, errors[:3]
    assert sorted(got) == sorted(expected)
    _check_states(states, lambda: iter(_loader(workers)), expected)


@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_device_iterator_shared_by_eight_threads_delivers_each_batch_once(no_leaks, workers, prefetch):
    from grainlike.jax.device_iterator import DeviceIterator

    expected = _loader_order(workers)
    it = DeviceIterator(iter(_loader(workers)), prefetch=prefetch)
    try:
        got, errors, states = _hammer(it)
    finally:
        it.close()
    assert not errors, errors[:3]
    assert sorted(got) == sorted(expected)
    _check_states(states, lambda: DeviceIterator(iter(_loader(workers)), prefetch=prefetch), expected)
