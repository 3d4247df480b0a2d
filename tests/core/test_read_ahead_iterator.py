"""``ReadAhead``: the read-ahead iterator DeviceIterator, InJitIterator, thread prefetch and the builder share.

Its state is the wrapped iterator's after the last item delivered, whatever the
thread has read; it restores, closes and stops as the module docstring says.
"""

from __future__ import annotations

import gc
import threading

import pytest

from grainlike.core.errors import ClosedIteratorError
from grainlike.core.read_ahead import ReadAhead
from tests.helpers.leaks import wait_until

pytestmark = pytest.mark.timeout(60)

THREAD = "grainlike-read-ahead-test"


class Counter:
    """Yields 1..n; its state is how many it has yielded. Refuses states that are not {"n": int in [0, n]}."""

    def __init__(self, n=10, fail_at=None, block_at=None):
        self.n, self.count, self.fail_at, self.block_at = n, 0, fail_at, block_at
        self.release = threading.Event()
        self.closed = False

    def __iter__(self):
        return self

    def __next__(self):
        if self.count == self.n:
            raise StopIteration
        if self.count + 1 == self.block_at:
            self.release.wait(30)
        self.count += 1
        if self.count == self.fail_at:
            raise KeyError(f"record {self.count} is broken")
        return self.count

    def get_state(self):
        return {"n": self.count}

    def set_state(self, state):
        if not isinstance(state, dict) or not isinstance(state.get("n"), int) or not 0 <= state["n"] <= self.n:
            raise ValueError(f"not a Counter state: {state!r}")
        self.count = state["n"]

    def close(self):
        self.closed = True
        self.release.set()  # ends a read waiting inside, as closing a loader ends one waiting for workers


def threads():
    return [t for t in threading.enumerate() if t.name == THREAD]


def read_ahead(wrapped, prefetch=3, **kwargs):
    return ReadAhead(wrapped, prefetch, "Test", name=THREAD, **kwargs)


def next_in_thread(it):
    """Starts ``next(it)`` in a thread; returns (thread, out), out[0] its value or exception."""
    out = []

    def run():
        try:
            out.append(next(it))
        except BaseException as e:  # noqa: BLE001 - the test looks at what came back
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.mark.parametrize("keep_state", [False, True])
@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_state_is_after_each_delivered_item_while_the_thread_reads_ahead(prefetch, keep_state):
    source = Counter(10)
    with read_ahead(source, prefetch, keep_state=keep_state) as it:
        assert it.get_state() == {"n": 0}
        for k in range(1, 11):
            assert next(it) == k
            # The thread has filled its buffer: the wrapped iterator is ahead of the user.
            assert wait_until(lambda: source.count == min(10, k + prefetch), timeout=10)
            assert it.get_state() == {"n": k}
        with pytest.raises(StopIteration):
            next(it)
        assert it.get_state() == {"n": 10}
    assert source.closed


@pytest.mark.parametrize("prefetch", [0, 2])
def test_prefetch_0_starts_no_thread_and_reads_in_next(prefetch):
    source = Counter(5)
    it = read_ahead(source, prefetch, convert=lambda x: (x, threading.current_thread().name))
    got = list(it)
    assert [x for x, _ in got] == [1, 2, 3, 4, 5]
    # convert runs in the thread when there is one, in next() when there is none.
    assert {name for _, name in got} == ({threading.current_thread().name} if prefetch == 0 else {THREAD})
    if prefetch == 0:
        assert threads() == []
    it.close()
    assert threads() == []


def test_get_state_from_another_thread_does_not_wait_behind_a_blocked_next():
    source = Counter(10, block_at=4)
    it = read_ahead(source, prefetch=2)
    try:
        assert [next(it), next(it)] == [1, 2]
        t, out = next_in_thread(it)  # gets 3, then waits for 4
        t.join(10)
        t, out = next_in_thread(it)
        t.join(0.3)
        assert t.is_alive() and not out  # blocked: item 4 is not read yet
        assert it.get_state() == {"n": 3}
        source.release.set()
        t.join(10)
        assert out == [4] and it.get_state() == {"n": 4}
    finally:
        source.release.set()
        it.close()


@pytest.mark.parametrize("keep_state", [False, True])
@pytest.mark.parametrize("prefetch", [0, 3])
def test_set_state_with_an_invalid_state_leaves_the_position(prefetch, keep_state):
    source = Counter(10)
    with read_ahead(source, prefetch, keep_state=keep_state) as it:
        assert [next(it), next(it)] == [1, 2]
        for bad in [{"n": 99}, {"m": 1}, None]:
            with pytest.raises(ValueError, match="not a Counter state"):
                it.set_state(bad)
            assert it.get_state() == {"n": 2}
        assert next(it) == 3
        it.set_state({"n": 7})
        assert it.get_state() == {"n": 7}
        assert list(it) == [8, 9, 10]


def test_a_wrapped_iterator_without_state_methods_is_named():
    it = read_ahead(iter([1, 2, 3]), 2)
    assert list(it) == [1, 2, 3]
    for call in (it.get_state, lambda: it.set_state({})):
        with pytest.raises(TypeError, match=r"the wrapped list_iterator has no get_state\(\)/set_state\(\); Test saves"):
            call()
    it.close()


def test_close_from_another_thread_ends_a_blocked_next():
    source = Counter(10, block_at=3)
    it = read_ahead(source, prefetch=2)
    try:
        assert [next(it), next(it)] == [1, 2]
        t, out = next_in_thread(it)
        t.join(0.3)
        assert t.is_alive()  # waiting for item 3, which the thread waits for
        it.close()
        t.join(10)
        assert len(out) == 1 and isinstance(out[0], ClosedIteratorError), out
        assert "Test is closed" in str(out[0]) and source.closed
        with pytest.raises(ClosedIteratorError, match="Test is closed"):
            next(it)
    finally:
        source.release.set()
    assert wait_until(lambda: threads() == [], timeout=10)


def test_close_and_dropping_leave_no_thread():
    it = read_ahead(Counter(100), prefetch=2)
    next(it)
    assert len(threads()) == 1
    it.close()
    assert threads() == []  # close() returns once its thread has ended
    it.close()  # idempotent

    source = Counter(100)
    it = read_ahead(source, prefetch=2)
    next(it)
    del it
    gc.collect()
    assert wait_until(lambda: threads() == [], timeout=10)
    assert not source.closed  # someone else may still hold the wrapped iterator


def test_start_prefetch_reads_ahead_before_the_first_next():
    source = Counter(10)
    with read_ahead(source, prefetch=3) as it:
        it.start_prefetch()
        assert wait_until(lambda: source.count == 3, timeout=10)
        assert it.get_state() == {"n": 0}
        assert list(it) == list(range(1, 11))


@pytest.mark.parametrize("prefetch", [0, 3])
def test_an_error_is_raised_in_order_and_reading_goes_on(prefetch):
    # keep_state=False: once nothing is read ahead, the state is the wrapped
    # iterator's own, past the failed read; True keeps the last delivered item's.
    for keep_state, after_error in [(False, {"n": 3}), (True, {"n": 2})]:
        with read_ahead(Counter(5, fail_at=3), prefetch, keep_state=keep_state) as it:
            assert [next(it), next(it)] == [1, 2]
            with pytest.raises(KeyError, match="record 3 is broken"):
                next(it)
            assert it.get_state() == after_error
            assert list(it) == [4, 5]


def test_items_read_apart_from_the_wrapped_iterator_report_its_state():
    source = Counter(9)

    class Pairs:
        def __next__(self):
            return (next(source), next(source))

    with read_ahead(source, prefetch=2, items=Pairs(), keep_state=True) as it:
        assert next(it) == (1, 2)
        assert it.get_state() == {"n": 2}
        assert it.peek() == (3, 4)  # read, not delivered
        assert it.get_state() == {"n": 2}
        item, state = it.read()
        assert item == (3, 4) and it.get_state() == {"n": 2}
        it.deliver(state)
        assert it.get_state() == {"n": 4}
        assert list(it) == [(5, 6), (7, 8)]
        assert it.get_state() == {"n": 8}  # the 9th, read alone, ended nothing delivered
