"""Reading a worker's results socket (``grainlike.workers.receiving.Stream``): whole messages, read ahead safely."""

from __future__ import annotations

import collections
import socket
import struct
import threading
import time

import pytest

from grainlike.workers.receiving import Stream

pytestmark = pytest.mark.timeout(60)


def _message(payload: bytes, long: bool = False) -> bytes:
    return (struct.pack("!iQ", -1, len(payload)) if long else struct.pack("!i", len(payload))) + payload


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 200_000))
    yield a, b
    a.close()
    b.close()


def test_messages_of_any_size_arrive_whole_and_in_order_however_the_bytes_are_read(pair):
    a, b = pair
    payloads = [b"x" * n for n in (0, 1, 7, 300, 300, 5, 70_000, 300, 1)] + [bytes(range(256)) * 3]
    messages = [_message(p, long=i % 3 == 2) for i, p in enumerate(payloads)]
    # Several at once (the reader reads ahead of a message's end and keeps the rest) ...
    sender = threading.Thread(target=a.sendall, args=(b"".join(messages),))
    sender.start()
    stream = Stream()
    got = [stream.read(b.fileno()) for _ in messages]
    sender.join()
    assert [bytes(m) for m in got] == messages
    assert all(type(m) is bytearray for m in got)
    # ... and a byte at a time.
    def trickle():
        for byte in b"".join(messages):
            a.send(bytes([byte]))
    sender = threading.Thread(target=trickle)
    sender.start()
    got = [stream.read(b.fileno()) for _ in messages]
    sender.join()
    assert [bytes(m) for m in got] == messages


def test_nothing_within_the_receive_timeout_is_none_and_a_closed_end_is_eof(pair):
    a, b = pair
    stream = Stream()
    t0 = time.monotonic()
    assert stream.read(b.fileno()) is None
    assert time.monotonic() - t0 >= 0.15
    a.close()
    with pytest.raises(EOFError):
        stream.read(b.fileno())


def test_an_end_within_a_message_is_an_error(pair):
    a, b = pair
    a.sendall(_message(b"y" * 100)[:50])
    a.close()
    with pytest.raises(OSError, match="end of file during message"):
        Stream().read(b.fileno())


def test_credits_come_back_with_the_segments_let_go_and_wake_only_a_waiting_worker():
    import collections
    import os

    from grainlike.workers.receiving import Credits, send_tick

    r, w = os.pipe()
    returned = []
    credits = Credits(r, 1, returned.extend)
    try:
        assert credits.acquire(blocking=False)  # The buffer's own credit.
        assert not credits.acquire(blocking=False)
        released = collections.deque([3, 9])
        send_tick(w, released)
        send_tick(w, released)  # (Nothing more to return: a credit alone.)
        assert not released and credits.taken == 0  # Nothing read until asked.
        assert credits.read() == [3, 9] and credits.taken == 2
        assert credits.acquire(blocking=False) and credits.acquire(blocking=False)
        # A worker waiting for a credit gets the next one, whichever thread reads it.
        got = []
        waiter = threading.Thread(target=lambda: got.append(credits.acquire()))
        waiter.start()
        time.sleep(0.1)
        assert not got
        send_tick(w, collections.deque([5]))
        credits.take_in()  # (The control thread's read: it must wake the waiter.)
        waiter.join(timeout=5)
        assert got == [True] and returned == [5]
        # release() (a stop) ends a wait too.
        waiter = threading.Thread(target=lambda: got.append(credits.acquire()))
        waiter.start()
        time.sleep(0.1)
        credits.release()
        waiter.join(timeout=5)
        assert got == [True, True]
        # A tick split across reads is read once whole.
        os.write(w, struct.pack("<II", 2, 7)[:6])
        assert credits.read() == []
        os.write(w, struct.pack("<II", 2, 7)[6:] + struct.pack("<I", 8))
        assert credits.read() == [7, 8] and credits.taken == 4
    finally:
        os.close(w)
        os.close(r)


def test_credits_read_by_any_thread_wake_the_control_thread_while_a_group_of_small_outputs_waits():
    # The control thread sleeps on the tick pipe while a group waits for the
    # consumer; when the main thread reads the credit first (a segment's refill),
    # the outbox's started pipe wakes the control thread instead (else it would
    # sleep up to a second with the group due).
    import os
    import select

    from grainlike.workers.main import _Outbox
    from grainlike.workers.receiving import Credits, send_tick

    r, w = os.pipe()
    credits = Credits(r, 4, lambda ids: None)
    calls = []
    outbox = _Outbox(results=None, control=None, credits=credits, stop=threading.Event(), guard=lambda: None)
    credits.on_credit = lambda: (calls.append(1), outbox.credited())
    try:
        def woken() -> bool:
            ready = select.select([outbox.started_r], [], [], 0)[0]
            if ready:
                os.read(outbox.started_r, 4096)
            return bool(ready)

        outbox._first = False
        outbox.add(b"record")  # A group starts: the control thread is told once.
        assert woken() and not woken()
        assert credits.read() == [] and calls == []  # No credit: nothing to wake for.
        send_tick(w, collections.deque())
        assert credits.read() == [] and calls == [1]  # Read by "the main thread": the control thread is woken.
        assert woken()
        outbox._group.clear()
        send_tick(w, collections.deque())
        credits.read()
        assert calls == [1, 1] and not woken()  # No group waits: nothing to wake.
    finally:
        for fd in (r, w, outbox.started_r, outbox.started_w):
            os.close(fd)
