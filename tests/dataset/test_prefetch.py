"""``to_iter_dataset()``'s and ``ThreadPrefetchIterDataset``'s iterators: reading ahead, states, errors.

Messages and behaviours follow grain 0.2.18 (its prefetch_test.py runs in
tests/grain_suite).
"""

import threading
import time

import pytest

from grainlike.core.errors import ClosedIteratorError, StateIndexError, StateTypeError
from grainlike.dataset import MapDataset, get_next_index, set_next_index
from grainlike.dataset.nodes.options import ReadOptions
from grainlike.dataset.transformations.thread_prefetch import ThreadPrefetchDatasetIterator

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("index", [-1, 21])
def test_an_out_of_range_next_index_raises_grains_index_error_and_keeps_the_position(index):
    it = iter(MapDataset.range(20).to_iter_dataset())
    assert [next(it), next(it)] == [0, 1]
    with pytest.raises(IndexError, match=rf"^Checkpoint `next_index` {index} is out of range for dataset of length 20\. ") as info:
        it.set_state({"next_index": index})
    assert isinstance(info.value, StateIndexError)
    assert "PrefetchDatasetIterator" in str(info.value)  # names the stage
    assert next(it) == 2
    it.set_state({"next_index": 20})  # the end is a position
    assert list(it) == []


def test_a_next_index_that_is_not_an_int_raises_type_error():
    it = iter(MapDataset.range(20).to_iter_dataset())
    with pytest.raises(StateTypeError, match="must be a non-negative int, got '3'"):
        it.set_state({"next_index": "3"})


def test_start_prefetch_reads_ahead_before_the_first_next():
    read = []
    ds = MapDataset.range(10).map(lambda x: read.append(x) or x)
    it = iter(ds.to_iter_dataset(ReadOptions(num_threads=4, prefetch_buffer_size=4)))
    it.start_prefetch()
    it.start_prefetch()  # idempotent
    deadline = time.monotonic() + 10
    while not read and time.monotonic() < deadline:
        time.sleep(0.01)
    assert read and max(read) < 4  # read ahead, no further than the buffer
    assert list(it) == list(range(10))
    it.close()


class _Counter:
    """A plain iterator with grain's checkpointable protocol (not a DatasetIterator)."""

    def __init__(self, n):
        self.n, self.count, self.closed = n, 0, False

    def __iter__(self):
        return self

    def __next__(self):
        if self.count == self.n:
            raise StopIteration
        self.count += 1
        return self.count

    def get_state(self):
        return {"counter": self.count}

    def set_state(self, state):
        self.count = state["counter"]

    def close(self):
        self.closed = True


@pytest.mark.parametrize("buffer_size", [0, 10])
def test_thread_prefetch_runs_a_plain_checkpointable_iterator_and_restores_it(buffer_size):
    source = _Counter(10)
    it = ThreadPrefetchDatasetIterator(source, prefetch_buffer_size=buffer_size)
    elements = [next(it) for _ in range(5)]
    checkpoint = it.get_state()
    assert checkpoint == {"counter": 5}  # the parent's state, after the last element returned
    elements.extend(it)
    assert elements == list(range(1, 11))
    it.set_state(checkpoint)
    assert list(it) == list(range(6, 11))
    before = threading.active_count()
    it.close()
    assert not source.closed  # not a pipeline stage: its owner closes it
    assert threading.active_count() <= before


def test_thread_prefetch_of_a_plain_iterator_has_no_next_index():
    it = ThreadPrefetchDatasetIterator(_Counter(3), prefetch_buffer_size=2)
    it.set_state({"counter": 1})
    with pytest.raises(ValueError, match="only supported for native dataset iterators.*_Counter"):
        get_next_index(it)
    with pytest.raises(ValueError, match="only supported for native dataset iterators"):
        set_next_index(it, 1)
    assert list(it) == [2, 3]
    it.close()


def _blocked_at(index, release):
    """A map that waits at ``index`` until ``release`` is set (read threads run it)."""

    def fn(x):
        if x == index:
            release.wait(30)
        return x

    return fn


def _next_within(it, timeout_s=10.0):
    """``next(it)`` run in a thread: its value, or "blocked" if it did not return in time."""
    out = ["blocked"]

    def take():
        try:
            out[0] = next(it)
        except Exception as e:  # noqa: BLE001 - the test looks at what came back
            out[0] = e

    t = threading.Thread(target=take, daemon=True)
    t.start()
    t.join(timeout_s)
    return out[0]


def test_an_element_is_delivered_while_a_later_element_of_its_chunk_is_computed():
    # grain computes one element at a time, so element 1 comes even if element
    # 2 never finishes (grain's test_doesnt_hang_on_process_kill); grainlike
    # reads [1, 2] as one chunk and delivers 1 as soon as it is computed.
    release = threading.Event()
    it = iter(MapDataset.range(12).map(_blocked_at(2, release)).to_iter_dataset())
    try:
        assert _next_within(it) == 0
        assert _next_within(it) == 1
        assert it.get_state() == {"next_index": 2}
        release.set()
        assert list(it) == list(range(2, 12))
    finally:
        release.set()
        it.close()


def test_close_from_another_thread_ends_a_next_waiting_inside_a_chunk():
    release = threading.Event()
    it = iter(MapDataset.range(12).map(_blocked_at(2, release)).to_iter_dataset())
    try:
        assert [next(it), next(it)] == [0, 1]
        got = []
        t = threading.Thread(target=lambda: got.append(_next_within(it)), daemon=True)
        t.start()
        time.sleep(0.2)  # (waiting for element 2, or not yet: either way close() ends it)
        it.close()
        t.join(15)
        assert len(got) == 1 and isinstance(got[0], ClosedIteratorError), got
    finally:
        release.set()


def _array_unless_multiple_of_3(x):
    import numpy as np

    return None if x % 3 == 0 else np.full(4, x)


@pytest.mark.parametrize("threads", [0, 2])
@pytest.mark.parametrize("k", [1, 5, 64])
def test_take_returns_what_as_many_nexts_would_with_their_states(threads, k):
    # Array elements and a filter's Nones (dropped, as next() drops them), read
    # in the calling thread or in read threads.
    def make():
        ds = MapDataset.range(100).filter(lambda x: x % 3 != 0).map(lambda x: __import__("numpy").full(4, x))
        return iter(ds.to_iter_dataset(ReadOptions(num_threads=threads, prefetch_buffer_size=8)))

    by_take, by_next = make(), make()
    while True:
        try:
            chunk = by_take.take(k)
        except StopIteration:
            break
        taken = chunk.values
        assert 1 <= len(taken) <= k
        # At consecutive positions, the last one just read.
        assert chunk.positions is None and chunk.start + len(taken) == by_take.get_state()["next_index"]
        expected = [next(by_next) for _ in taken]
        assert [t.tolist() for t in taken] == [e.tolist() for e in expected]
        assert by_take.get_state() == by_next.get_state()
    with pytest.raises(StopIteration):
        next(by_next)
    assert by_take.get_state() == by_next.get_state() == {"next_index": 100}


def test_a_batch_takes_its_elements_and_an_error_drops_the_partial_batch_as_islice():
    def fail_at_7(x):
        if x == 7:
            raise ValueError("seven")
        return x

    it = iter(MapDataset.range(12).map(fail_at_7).to_iter_dataset().batch(5))
    assert next(it).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="seven"):
        next(it)  # 5 and 6 were taken: they are gone with the batch, as grain drops them
    assert it.get_state() == {"next_index": 7}
    with pytest.raises(ValueError, match="seven"):
        next(it)  # the failing element is read again
