"""Receiving a worker's message in steps, so that a step that fails can be tried again.

The pool reads a message's bytes (``read_bytes``), unpickles them, receives and
maps an ``OUT``'s new segments (``map_segments``), then makes its arrays. A
message between those steps is a ``PartialMessage``; a failure there (memory
pressure in the consumer) is carried out of the pool by ``ReceiveFailed``, and
the next ``next()`` goes on from the step that failed (``WorkerPool._message``).
"""

from __future__ import annotations

import os
from typing import Any, Optional


def read_bytes(conn: Any) -> bytes:
    """One message's bytes from a worker's socket (unpickled separately, in a step of its own)."""
    return conn.recv_bytes()


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
