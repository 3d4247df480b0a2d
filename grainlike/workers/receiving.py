"""Receiving a worker's message in steps, so that a step that fails can be tried again.

The pool reads a message's bytes (``read_bytes``), unpickles them, receives and
maps an ``OUT``'s new segments (``map_segments``), then makes its arrays. A
message between those steps is a ``PartialMessage``; a failure there (memory
pressure in the consumer) is carried out of the pool by ``ReceiveFailed``, and
the next ``next()`` goes on from the step that failed (``WorkerPool._message``).
"""

from __future__ import annotations

import functools
import os
import pickle
import select
import struct
from typing import Any, Optional

from grainlike.workers.messages import TICK


def read_bytes(conn: Any) -> bytes:
    """One message's bytes from a worker's socket (unpickled separately, in a step of its own).

    What ``conn.recv_bytes()`` returns, read with two ``os.read`` calls (the
    length, then the message) rather than through ``BytesIO`` buffers: the
    consumer receives hundreds of messages a second.

    Raises:
      EOFError: the worker's end is closed (before a message).
      OSError: the connection is closed here, or ends within a message.
    """
    fd = conn.fileno()
    (size,) = _LENGTH.unpack(_read_exactly(fd, 4, True))
    if size == -1:  # Over 2 GiB: a 64-bit length follows (multiprocessing's framing).
        (size,) = _LONG_LENGTH.unpack(_read_exactly(fd, 8, False))
    return _read_exactly(fd, size, False)


_LENGTH = struct.Struct("!i")
_LONG_LENGTH = struct.Struct("!Q")


def _read_exactly(fd: int, size: int, first: bool) -> bytes:
    """``size`` bytes from ``fd``; EOFError if it ends at once and ``first``, else OSError."""
    data = os.read(fd, size)
    if len(data) == size:
        return data
    chunks, remaining = [data], size - len(data)
    while True:
        if not data:
            if first and remaining == size:
                raise EOFError
            raise OSError("got end of file during message")
        if not remaining:
            return b"".join(chunks)
        data = os.read(fd, remaining)
        chunks.append(data)
        remaining -= len(data)


def map_segments(reader: Any, segments: list, fds: list) -> None:
    """Maps an ``OUT``'s new segments on ``reader`` (a ``shm.SegmentReader``) from copies of ``fds``.

    ``fds`` stay open, for another try should the mapping fail.
    """
    copies: list = []
    try:
        for fd in fds:
            copies.append(os.dup(fd))
    except BaseException:
        for fd in copies:
            os.close(fd)
        raise
    reader.add(segments, copies)  # (Closes the copies.)


class PartialMessage:
    """A worker's message read from its socket whose reception here is not complete."""

    __slots__ = ("raw", "msg", "fds")

    def __init__(self, raw: bytes):
        self.raw = raw
        self.msg: Any = None
        self.fds: Optional[list] = None  # An OUT's segment descriptors, until mapped.

    def close_fds(self) -> None:
        fds, self.fds = self.fds, []
        for fd in fds or ():
            os.close(fd)


class ReceiveFailed(Exception):
    """Carries an error raised while a worker's message was half received."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class Pollers:
    """A ``select.poll`` per worker of its socket and exit sentinel, kept while they are the same.

    One poll(2) per wait, where ``multiprocessing.connection.wait`` builds and
    fills a selector each time (the consumer waits hundreds of times a second).
    """

    def __init__(self, worker_count: int):
        self._cached: list = [None] * worker_count

    def get(self, w: int, conn_fd: int, sentinel: int) -> Any:
        cached = self._cached[w]
        if cached is None or cached[0] != (conn_fd, sentinel):
            poller = select.poll()
            poller.register(conn_fd, select.POLLIN)
            poller.register(sentinel, select.POLLIN)
            cached = self._cached[w] = ((conn_fd, sentinel), poller)
        return cached[1]


def send_tick(control: Any, ids: list) -> None:
    """Sends worker its TICK with the segment ``ids`` it may reuse, on its control connection.

    Framed and pickled here as ``Connection.send`` would (the worker's ``recv()``
    unpickles any protocol), in one write; nothing to pickle without ids. A
    closed connection (the pool closing) is ignored.
    """
    try:
        if ids:
            payload = pickle.dumps((TICK, ids), pickle.HIGHEST_PROTOCOL)
            frame = _LENGTH.pack(len(payload)) + payload
        else:
            frame = _empty_tick()
        fd = control.fileno()
        while frame:
            frame = frame[os.write(fd, frame):]
    except (OSError, ValueError):
        pass


@functools.lru_cache(maxsize=None)
def _empty_tick() -> bytes:
    """A TICK message that returns no segments, framed once."""
    payload = pickle.dumps((TICK, []), pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(payload)) + payload
