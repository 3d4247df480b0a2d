"""The worker server's own process: ``forkserver_main``, its loop, and the peer check.

Started by ``server.WorkerServer`` as ``python -c "from grainlike.workers.server_loop
import forkserver_main; forkserver_main(...)"``; it preloads a worker's modules,
then forks a worker for each request on its socket until the program has gone.
"""

from __future__ import annotations

import os
import signal
import stat
import struct
import sys
import time
from typing import Any, Callable

from grainlike.workers.server import _FOLDER_PREFIX, proc_stat


def _remove_own_socket_at_exit(path: str) -> None:
    """In a worker server listening at the file ``path``: removes it (and its folder, if then empty) at exit.

    If the program was killed (SIGKILL), nothing else would remove the folder.
    """
    import atexit

    def remove() -> None:
        try:
            os.unlink(path)
            folder = os.path.dirname(path)
            if os.path.basename(folder).startswith(("pymp-", _FOLDER_PREFIX)):
                os.rmdir(folder)  # Only if empty: the parent's other files stay.
        except OSError:
            pass

    atexit.register(remove)


def _in_tree(pid: int, root: int) -> bool:
    """Whether process ``pid`` is ``root`` or below it (by the parents /proc names)."""
    for _ in range(1024):
        if pid == root:
            return True
        fields = proc_stat(pid) if pid > 1 else []
        if len(fields) < 2 or not fields[1].isdigit():
            return False
        pid = int(fields[1])
    return False


# A peer of the worker server must send its whole request within this long of
# connecting (multiprocessing's client sends it at once); then it is dropped.
REQUEST_TIMEOUT_S = 5.0
# Connections waiting for their request at once; a new one beyond it drops the oldest.
_MAX_WAITING = 128
# Connections accepted per turn of the loop, so that requests already in are served meanwhile.
_ACCEPTS_PER_TURN = 16


def forkserver_main(listener_fd: int, alive_r: int, preload: list) -> None:
    """The worker server: forks a worker for each request on its socket, until the program has gone.

    It speaks multiprocessing's forkserver protocol (``WorkerServer``) but, unlike
    Python's own loop (which dies on any peer's error but ECONNABORTED, and
    waits without a bound for a peer that connects and sends nothing), it never
    depends on one peer: every connection is read only when it is readable,
    without blocking, and dropped if its request has not come within
    ``REQUEST_TIMEOUT_S``; what a peer sends that is not a request (nothing,
    a byte, junk, descriptors that are not pipes) closes that connection and
    whatever descriptors came with it; a flood of connections drops the
    oldest ones; an error while serving one connection ends that connection
    only. On Linux (an abstract address) only peers of this uid in the
    program's process tree are served (``_allowed``); any other connection is
    closed before a byte is read.
    """
    import socket

    for name in preload:
        try:
            __import__(name)
        except ImportError:
            pass
    from multiprocessing import util

    util._close_stdin()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=listener_fd)
    address = listener.getsockname()
    abstract = isinstance(address, bytes) or address.startswith("\0") or not address
    if not abstract:
        _remove_own_socket_at_exit(address)
    _Server(listener, alive_r, check_peers=abstract and hasattr(socket, "SO_PEERCRED")).run()


def _ignore_signal(*_: Any) -> None:
    """SIGCHLD's handler: the signal only wakes the loop (through the wakeup fd)."""


class _Server:
    """The state of ``forkserver_main``'s loop."""

    def __init__(self, listener: Any, alive_r: int, check_peers: bool):
        import selectors

        self.listener = listener
        listener.setblocking(False)
        self.alive_r = alive_r
        self.check_peers = check_peers
        self.uid, self.program = os.getuid(), os.getppid()
        # Connections waiting for their request -> deadline, oldest first.
        self.waiting: dict = {}
        # Forked pid -> the requester's status pipe (write end), for its exit code.
        self.children: dict = {}
        self.sig_r, self.sig_w = os.pipe()
        os.set_blocking(self.sig_r, False)
        os.set_blocking(self.sig_w, False)
        self.selector = selectors.DefaultSelector()
        self.handlers: dict = {}

    def run(self) -> None:
        import selectors

        self.handlers = {
            signal.SIGCHLD: signal.signal(signal.SIGCHLD, _ignore_signal),
            signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),  # Ctrl-C is the program's.
        }
        signal.set_wakeup_fd(self.sig_w)
        for fileobj in (self.listener, self.alive_r, self.sig_r):
            self.selector.register(fileobj, selectors.EVENT_READ)
        while True:
            timeout = None
            if self.waiting:
                timeout = max(0.0, next(iter(self.waiting.values())) - time.monotonic())
            ready = {key.fileobj for key, _ in self.selector.select(timeout)}
            if self.alive_r in ready:
                try:
                    if not os.read(self.alive_r, 1):
                        return  # Every process of the program has gone.
                except OSError:
                    return
            if self.sig_r in ready:
                self._guarded(self._reap)
            for conn in [c for c in ready if c in self.waiting]:
                self._guarded(self._serve, conn)
            if self.listener in ready:
                self._guarded(self._accept)
            self._expire()

    def _guarded(self, step: Callable, *args: Any) -> None:
        """Runs one step; its failure is that step's only (a peer's request, an exit code not delivered)."""
        try:
            step(*args)
        except Exception:  # noqa: BLE001 - nothing one peer does may end the server
            pass

    def _allowed(self, conn: Any) -> bool:
        """Whether the peer of ``conn`` is of this uid and in the program's process tree (SO_PEERCRED)."""
        if not self.check_peers:
            return True  # A socket file in a 0700 folder: only this user reaches it.
        import socket
        import struct

        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid, uid, _ = struct.unpack("3i", creds)
        except OSError:
            return False
        return uid == self.uid and _in_tree(pid, self.program)

    def _accept(self) -> None:
        import selectors

        for _ in range(_ACCEPTS_PER_TURN):
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                # Out of descriptors (peers holding many connections): the oldest go.
                if not self.waiting:
                    return
                self._drop(next(iter(self.waiting)))
                continue
            if not self._allowed(conn):
                conn.close()  # Before a byte is read.
                continue
            conn.setblocking(False)
            if len(self.waiting) >= _MAX_WAITING:
                self._drop(next(iter(self.waiting)))
            self.waiting[conn] = time.monotonic() + REQUEST_TIMEOUT_S
            self.selector.register(conn, selectors.EVENT_READ)

    def _drop(self, conn: Any) -> None:
        self.waiting.pop(conn, None)
        try:
            self.selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def _expire(self) -> None:
        now = time.monotonic()
        while self.waiting:
            conn, deadline = next(iter(self.waiting.items()))
            if deadline > now:
                return
            self._drop(conn)

    def _serve(self, conn: Any) -> None:
        """Reads one request from ``conn`` (readable) and forks for it; anything else just ends ``conn``."""
        import socket
        from multiprocessing import forkserver

        fds: list = []
        try:
            try:
                data, fds, flags, _ = socket.recv_fds(conn, 1, forkserver.MAXFDS_TO_SEND + 1)
            except (BlockingIOError, InterruptedError):
                return  # Not readable after all: drop it (a real client's request is there at once).
            if (
                not data
                or flags & getattr(socket, "MSG_CTRUNC", 0)
                or not 2 <= len(fds) <= forkserver.MAXFDS_TO_SEND
                or data[0] != len(fds) % 256
            ):
                return
            child_r, child_w, *inherited = fds
            if not (stat.S_ISFIFO(os.fstat(child_r).st_mode) and stat.S_ISFIFO(os.fstat(child_w).st_mode)):
                return
            # Writes of the pid and the exit code must never wait for the requester.
            os.set_blocking(child_w, False)
            pid = self._fork(child_r, child_w, inherited)
            fds.remove(child_w)  # Kept for the exit code.
            self.children[pid] = child_w
            try:
                os.write(child_w, _SIGNED.pack(pid))
            except OSError:
                pass  # The requester has gone; its process is reaped as any other.
        finally:
            self._drop(conn)
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _fork(self, child_r: int, child_w: int, inherited: list) -> int:
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            # The server's own descriptors and the other requests' are not the worker's.
            self.selector.close()
            self.listener.close()
            for conn in list(self.waiting):
                conn.close()
            for fd in [self.alive_r, self.sig_r, self.sig_w, child_w, *self.children.values()]:
                os.close(fd)
            code = _serve_one(child_r, inherited, self.handlers)
        except Exception:
            sys.excepthook(*sys.exc_info())  # As multiprocessing's forkserver: the worker's start failed.
            sys.stderr.flush()
        finally:
            os._exit(code)

    def _reap(self) -> None:
        """Collects exited children and writes each one's exit code to its requester."""
        try:
            os.read(self.sig_r, 65536)
        except OSError:
            pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd = self.children.pop(pid, None)
            if fd is None:
                continue
            try:
                os.write(fd, _SIGNED.pack(os.waitstatus_to_exitcode(status)))
            except OSError:
                pass  # The requester has gone or stopped reading.
            finally:
                os.close(fd)


# multiprocessing's forkserver numbers (pids, exit codes) on the wire.
_SIGNED = struct.Struct("q")


def _serve_one(child_r: int, fds: list, handlers: dict) -> int:
    """In the forked child: runs the process the requester sends over ``child_r``, as multiprocessing's forkserver does.

    ``fds`` are the requester's: the program's alive pipe, its resource
    tracker's pipe, then the descriptors the process inherits.
    """
    from multiprocessing import forkserver, resource_tracker, spawn

    signal.set_wakeup_fd(-1)
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    if len(fds) < 2:
        return 1  # Not a worker's request.
    forkserver._forkserver._forkserver_alive_fd, resource_tracker._resource_tracker._fd = fds[0], fds[1]
    forkserver._forkserver._inherited_fds = fds[2:]
    return spawn._main(child_r, os.dup(child_r))
