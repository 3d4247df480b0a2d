"""Receiving a worker's message in steps, so that a step that fails can be tried again.

The pool (``Receiving``, a part of ``WorkerPool``) reads a message's bytes
(``Stream``), parses (``frames``) or unpickles them, receives and maps an
``OUT``'s new segments (``map_segments``), then makes its arrays. A message
between those steps is a ``PartialMessage``; a failure there (memory pressure
in the consumer) is carried out of the pool by ``ReceiveFailed``, and the next
``next()`` goes on from the step that failed (``Receiving._message``).
"""

from __future__ import annotations

import functools
import os
import select
import socket
import struct
import threading
import time
from typing import Any, Callable, Optional

from grainlike.core.errors import WorkerDiedError, WorkerStalledError, _WorkerFailed, add_note
from grainlike.workers import frames, shm
from grainlike.workers.messages import OUT, OUTS, RESET_DONE


def set_receive_timeout(conn: Any, seconds: float) -> None:
    """Makes a read of ``conn``'s socket that gets nothing for ``seconds`` fail with ``BlockingIOError``.

    So that the consumer waits for a message in its ``read`` (one system call
    per message), and still looks at the worker's liveness and ``close()``
    every ``seconds`` (``WorkerPool._receive``).
    """
    sock = socket.socket(fileno=conn.fileno())
    try:
        whole = int(seconds)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", whole, int((seconds - whole) * 1e6)))
    finally:
        sock.detach()  # The connection keeps owning the descriptor.


class Stream:
    """A worker's results socket as the consumer reads it: one message at a time, mostly in one system call.

    A message is its length (4 bytes, or -1 and 8 bytes) and its bytes, read
    as they are into a ``bytearray`` the size of the worker's last message
    (its messages are mostly alike), which is then the message: the arrays
    of a frame (``frames``) are made on it, writable as unpickled ones are.
    What comes beyond the message's end (the start of the next) is kept for
    the next read. The socket carries no descriptors (those come on the
    control socket), so nothing is lost by reading ahead.
    """

    __slots__ = ("carry", "guess")

    def __init__(self) -> None:
        self.carry = b""  # Bytes after the last message read.
        self.guess = 64  # The size of the last message.

    def read(self, fd: int) -> Optional[bytearray]:
        """The next message from socket ``fd``, with its length; None if none began within its receive timeout.

        Within a message it waits as long as it takes.

        Raises:
          EOFError: the worker's end is closed (before a message).
          OSError: the connection is closed here, or ends within a message.
        """
        if self.carry:
            buf, got = bytearray(self.carry), len(self.carry)
            self.carry = b""
        else:
            buf = bytearray(self.guess)
            try:
                got = os.readv(fd, [buf])
            except BlockingIOError:
                return None
            if not got:
                raise EOFError
        if got < 4:
            buf[got:] = _read_exactly(fd, 4 - got)
            got = 4
        (size,) = _LENGTH.unpack_from(buf)
        if size >= 0:
            size += 4
        else:  # Its long form: -1, then 8 bytes.
            if got < 12:
                buf[got:] = _read_exactly(fd, 12 - got)
                got = 12
            size = 12 + _LONG_LENGTH.unpack_from(buf, 4)[0]
        self.guess = size
        if got > size:
            self.carry = bytes(buf[size:got])
        elif got < size:
            if len(buf) < size:
                buf[len(buf) :] = bytes(size - len(buf))
            _read_into(fd, memoryview(buf)[got:size])
        if len(buf) > size:
            del buf[size:]
        return buf

_LENGTH = struct.Struct("!i")
_LONG_LENGTH = struct.Struct("!Q")


def _read_exactly(fd: int, size: int) -> bytes:
    """``size`` bytes from ``fd``, within a message; OSError if it ends first."""
    buf = bytearray(size)
    _read_into(fd, memoryview(buf))
    return bytes(buf)


def _read_into(fd: int, view: memoryview) -> None:
    """Fills ``view`` from ``fd``, within a message; OSError if it ends first."""
    got, size = 0, len(view)
    while got < size:
        try:
            n = os.readv(fd, [view[got:]])
        except BlockingIOError:  # The receive timeout, within a message: wait on.
            continue
        if not n:
            raise OSError("got end of file during message")
        got += n


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


def kept_note(w: int) -> str:
    """The note on an error raised while worker ``w``'s message was half received (and is kept)."""
    return (
        f"grainlike: this process failed receiving an output of worker {w} (its bytes are kept "
        "here); nothing was delivered, and the next next() receives the same output again"
    )


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

    def get(self, w: int, conn_fd: int, proc: Any) -> Any:
        """The poll object of worker ``w``'s socket ``conn_fd`` and process ``proc``'s exit sentinel."""
        cached = self._cached[w]
        if cached is None or cached[0] != conn_fd or cached[1] is not proc:
            poller = select.poll()
            poller.register(conn_fd, select.POLLIN)
            poller.register(proc.sentinel, select.POLLIN)
            cached = self._cached[w] = (conn_fd, proc, poller)
        return cached[2]


def send_tick(fd: int, released: Any) -> None:
    """Returns a worker a credit, and the segment ids in deque ``released``, on its tick pipe ``fd`` (``Credits``).

    One write of ``count, ids...`` (u32 each); the same few recur, each
    packed once. A closed pipe (the pool closing) is ignored.
    """
    try:
        if released:
            ids = []
            while released:  # (Other threads may append meanwhile: never iterate over it.)
                ids.append(released.popleft())
            frame = _tick(tuple(ids))
        else:
            frame = _EMPTY_TICK
        n = os.write(fd, frame)  # (Whole, in the common case: the pipe holds few ticks.)
        while n < len(frame):
            frame = frame[n:]
            n = os.write(fd, frame)
    except (OSError, ValueError):
        pass


@functools.lru_cache(maxsize=1024)
def _tick(ids: tuple) -> bytes:
    """A tick returning segments ``ids``."""
    return struct.pack(f"<I{len(ids)}I", len(ids), *ids)


_EMPTY_TICK = _tick(())
_TICK_COUNT = struct.Struct("<I")


class Credits:
    """The messages this worker may still send: its buffer size, plus one per message the consumer took.

    The consumer returns a credit, and the segments it let go, on the worker's
    tick pipe (``receiving.send_tick``). No thread waits on that pipe while the
    worker computes, so returning a credit wakes nothing: it costs the consumer
    a write. The pipe is read when a credit is needed (``acquire``, which waits
    there if it must), a segment is (``SegmentPool.refill``), or a group of
    small outputs waits for the consumer (the control thread). ``acquire`` and
    ``release`` are the ``threading.Semaphore``'s they stand for.

    Args:
      fd: the tick pipe's read end (made non-blocking).
      count: the buffer size.
      on_returned: takes the returned segments' ids (not from ``read``).
    """

    def __init__(self, fd: int, count: int, on_returned: Callable[[list], None]):
        self.fd = fd
        os.set_blocking(fd, False)
        self._wake_r, self._wake_w = os.pipe()  # release() ends a wait in acquire().
        os.set_blocking(self._wake_r, False)
        self._lock = threading.Lock()
        self._carry = b""
        self._count = count
        self.taken = 0  # Messages the consumer took.
        self._on_returned = on_returned
        self._ended = False  # The consumer's end is closed.
        self._waiting = False  # An acquire() waits: a credit read by another thread wakes it.
        # Called after credits came in: wakes a thread that waits on the pipe for
        # them (the control thread, for a group of small outputs) should another
        # thread have read them first.
        self.on_credit: Optional[Callable[[], None]] = None

    def read(self) -> list:
        """Takes in what the consumer sent, without waiting; returns the returned segments' ids."""
        ids: list = []
        with self._lock:
            data = self._carry
            while True:
                try:
                    chunk = os.read(self.fd, 65536)
                except BlockingIOError:
                    break
                if not chunk:
                    self._ended = True
                    break
                data += chunk
            at = 0
            credited = 0
            while len(data) - at >= 4:
                (n,) = _TICK_COUNT.unpack_from(data, at)
                end = at + 4 + 4 * n
                if len(data) < end:
                    break
                ids.extend(struct.unpack_from(f"<{n}I", data, at + 4))
                credited += 1
                at = end
            self._carry = data[at:]
            self._count += credited
            self.taken += credited
            if credited and self._waiting:
                os.write(self._wake_w, b"x")
        if credited and self.on_credit is not None:
            self.on_credit()
        return ids

    def take_in(self) -> None:
        """Reads the pipe and hands the returned segments over (``on_returned``)."""
        ids = self.read()
        if ids:
            self._on_returned(ids)

    def acquire(self, blocking: bool = True) -> bool:
        while True:
            self.take_in()
            with self._lock:
                if self._count > 0:
                    self._count -= 1
                    return True
                if not blocking:
                    return False
                self._waiting = True
            if self._ended:  # (The control thread ends the worker.)
                time.sleep(0.05)
            else:
                select.select([self.fd, self._wake_r], [], [], 1.0)
            with self._lock:
                self._waiting = False
            try:
                os.read(self._wake_r, 64)
            except BlockingIOError:
                pass

    def release(self) -> None:
        """One more credit: the control thread's, when the worker stops, so a waiting ``acquire`` returns."""
        with self._lock:
            self._count += 1
        os.write(self._wake_w, b"x")


_TICK_COUNT = struct.Struct("<I")



class Receiving:
    """``WorkerPool``'s receiving of a worker's message, in steps (see the module doc).

    Uses the pool's ``_shutdown``, ``_partial``, ``_layouts``, ``_streams``,
    ``_pollers``, ``_resetting``, its credits (``_tick``) and its liveness
    (``_poll_ms``, ``_look``: ``liveness`` is above the wire).
    """

    def _recv(self, w: int, read: Optional[Callable[[Any], Any]] = None, waited: bool = False) -> Any:
        """Worker ``w``'s next message (``Stream``), or ``read(its control connection)`` once that is readable.

        Watches for close(), the worker's exit and its progress every ``POLL_S``:
        a message is waited for in its read (the socket's receive timeout), one
        system call, and anything else in a poll(2) of the socket and the exit
        sentinel. ``waited``: a read just got nothing (or failed): look first.
        """
        sd = self._shutdown
        conn = sd.results[w] if read is None else sd.controls[w]
        proc = sd.procs[w]
        watch = None  # Made once a wait lasts (a stall is seen at most one look later).
        while True:
            if self._closed:
                raise self._closed_error(w)
            try:
                conn_fd = conn._handle  # (fileno() less its two calls; None once closed.)
                if conn_fd is None:
                    raise OSError("handle is closed")
                if read is None:
                    raw = None if waited else self._streams[w].read(conn_fd)
                    waited = False
                    if raw is not None:
                        return raw
                    ready = self._pollers.get(w, conn_fd, proc).poll(0)
                else:
                    ready = self._pollers.get(w, conn_fd, proc).poll(self._poll_ms)
                if not ready:
                    watch = self._look(w, watch)
                    continue
                if any(fd == conn_fd for fd, _ in ready) or conn.poll():
                    if read is None:
                        continue  # A message began meanwhile.
                    try:
                        return read(conn)
                    except EOFError:
                        pass  # The worker is gone; report how.
                error = self._died_error(w)
            except EOFError:  # The worker is gone; report how.
                error = self._died_error(w)
            except (OSError, ValueError, IndexError):
                # close() in another thread closed the pipes or the process handle.
                if self._closed:
                    raise self._closed_error(w) from None
                raise
            raise error

    def _message(self, w: int) -> tuple:
        """Worker ``w``'s next message, fully received: ``(message, output)`` (an ``OUT``'s output, else None).

        Receiving takes steps in this process: reading the bytes, parsing or
        unpickling them, receiving and mapping an ``OUT``'s new segments, making its arrays.
        A failure after the bytes were read and before the arrays are made
        (``MemoryError``, a mapping refused under memory pressure) keeps the
        message half received and raises ``ReceiveFailed``: the next call goes
        on from the step that failed, so the output is neither lost nor repeated
        and no worker counts as ended. A failure while reading the bytes or
        making the arrays leaves the stream or the segments in an unknown state:
        it is raised as it is, and the pool's owner restarts the workers from
        the last delivered outputs.
        """
        part = self._partial[w]
        try:
            if part is None:
                waited, self._waited = self._waited == w, -1  # (The pool's _plain_out waited already.)
                raw = self._recv(w, waited=waited)
                output = frames.plain_out(raw, self._layouts[w], self._shutdown.readers[w])
                if output is not None:
                    return (OUT, raw, frames.PLAIN_OUT_OFFSETS, ()), output
                try:
                    msg = frames.message(raw, self._layouts[w])
                except frames.Malformed:
                    raise
                except BaseException:
                    self._partial[w] = PartialMessage(raw)  # For another try.
                    raise
                if msg[0] != OUT:
                    return msg, None
                if not msg[3]:  # (The commonest OUT: no new segments, nothing to keep.)
                    return msg, frames.output(raw, msg[2][0], self._layouts[w], self._shutdown.readers[w])
                part = self._partial[w] = PartialMessage(raw)
                part.msg = msg
            if part.msg is None:
                part.msg = frames.message(part.raw, self._layouts[w])
            msg = part.msg
            output = None
            if msg[0] == OUT:
                if msg[3] and part.fds is None:
                    # New segments: their descriptors follow the message.
                    self._partial[w] = None  # (A failure receiving them breaks the stream.)
                    part.fds = self._recv(w, functools.partial(shm.recv_fds, count=len(msg[3])))
                    self._partial[w] = part
                if part.fds:
                    map_segments(self._shutdown.readers[w], msg[3], part.fds)
                    part.close_fds()
                self._partial[w] = None  # (A failure making the arrays may have released segments.)
                output = frames.output(msg[1], msg[2][0], self._layouts[w], self._shutdown.readers[w])
        except frames.Malformed as e:
            self._partial[w] = None  # Not to be received again: the pool's owner starts new workers.
            raise self._malformed(w, e) from None
        except WorkerDiedError as e:
            raise self._failure(w, e) from None
        except WorkerStalledError as e:
            raise self._failure(w, e, responsive=False) from None
        except _WorkerFailed:
            raise
        except Exception as e:
            if self._partial[w] is None or self._closed:
                raise
            add_note(e, kept_note(w))
            raise ReceiveFailed(e) from None
        self._partial[w] = None
        return msg, output

    def _drain_stale(self, w: int) -> None:
        """Drops worker ``w``'s messages from before its latest reset, up to its ``RESET_DONE``.

        Outputs are dropped as if delivered (their segments and credits go back),
        an end, an error or an exit report is ignored; a death or stall is reported as ever.
        """
        while self._resetting[w] is not None:
            msg, output = self._message(w)
            del output  # Let go at once: the segments are released.
            kind = msg[0]
            if kind in (OUT, OUTS):
                self._tick(w)
            elif kind == RESET_DONE and msg[1] == self._resetting[w]:
                self._resetting[w] = None
