"""The worker server: where workers start when they cannot fork from the program.

A forkserver of grainlike's own (the process-wide one stays the program's) that
has preloaded ``main``, booted when grainlike is imported (``start_server_early``).
It speaks multiprocessing's forkserver protocol (``WorkerServer``) with a loop of
its own (``forkserver_main``) that no peer can stop or block; the workers it
starts are watched through pidfds, not through it, so its death is no worker's.
Workers it forks, or spawns where there is no server (``server_supported``), get
preparation data naming no main module, so they never re-run the user's
``__main__``. Importing this module costs the standard library only.
"""

from __future__ import annotations

import errno
import functools
import multiprocessing
import multiprocessing.context
import os
import re
import signal
import stat
import struct
import sys
import tempfile
import threading
import time
import types
import weakref
from typing import Any, Callable, Optional

WORKER_MODULE = "grainlike.workers.main"
# What a worker imports before its first output, preloaded by name (this layer
# imports nothing above it); nothing more, as the server's boot can be on the
# first batch's path (W4c in docs/performance.md).
TASK_MODULES = (
    "grainlike.workers.start",
    "grainlike.loader.stages",
    "grainlike.loader.output_stages",
    "grainlike.loader.chunked",
    "grainlike.loader.elastic_restore",
    "grainlike.dataset.process_prefetch",
    "grainlike.dataset.worker_slice_task",
    "grainlike.dataset.source",
    "grainlike.dataset.mix",
    "grainlike.dataset.slice",
)
# Preloaded too when this process has them loaded: their sources need them in
# every worker, and importing tensorflow_datasets or datasets costs each worker 1-2 s.
PRELOAD_IF_LOADED = ("tensorflow_datasets", "datasets", "pyarrow.parquet", "s3fs", "gcsfs")
_lock = threading.Lock()


def native_thread_count() -> int:
    """The threads of this process, native ones included (0 where the OS does not say)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


# The threads running when grainlike was imported (numpy's BLAS pool, which survives
# a fork), for ``start.fork_is_safe``; 0 (unknown) when a library that starts
# threads of its own was loaded first.
_THREAD_STARTERS = ("cv2", "array_record", "torch", "tensorflow")
THREADS_AT_IMPORT = 0


def note_threads_at_import() -> None:
    """Sets ``THREADS_AT_IMPORT``; ``import grainlike`` calls it once numpy is imported.

    Not at this module's import, which comes before numpy's so that the server boots earlier.
    """
    global THREADS_AT_IMPORT
    THREADS_AT_IMPORT = 0 if any(m in sys.modules for m in _THREAD_STARTERS) else native_thread_count()


def _strip_main(data: dict) -> dict:
    # Without these entries the child keeps the forkserver's own __main__ instead
    # of importing (and so re-running) the user's main module.
    data.pop("init_main_from_name", None)
    data.pop("init_main_from_path", None)
    return data


class _SpawnWithoutMain(types.ModuleType):
    """``multiprocessing.spawn`` as a worker's launcher sees it: no main module."""

    def __init__(self):
        from multiprocessing import spawn

        super().__init__(spawn.__name__)
        self.__dict__.update(vars(spawn))
        self.get_preparation_data = lambda name: _strip_main(spawn.get_preparation_data(name))


def _rebound(f: Any, module: types.ModuleType, **replaced: Any) -> Any:
    """The standard library's own function ``f`` run with some of its ``module``'s globals replaced."""
    return types.FunctionType(f.__code__, {**vars(module), **replaced}, f.__name__, f.__defaults__, f.__closure__)


def _rebound_popen(base: type, method: str, module: types.ModuleType, name: str, **replaced: Any) -> type:
    """A subclass of ``base`` whose ``method`` is ``_rebound``."""
    return type(name, (base,), {method: _rebound(getattr(base, method), module, **replaced), "__module__": __name__})


# How long a served worker's exit status may take to come from its server once its pidfd reports the exit.
_STATUS_WAIT_S = 1.0
# The exit code multiprocessing reports when a served process's status never came.
UNKNOWN_EXIT_CODE = 255


class _ExitSeenThroughPidfd:
    """A served worker whose exit is seen through a pidfd (Linux 5.3+), not through its server.

    multiprocessing's forkserver ``Popen`` learns a child's exit from the
    server's status pipe, so a server that dies makes every worker it started
    look dead (exit code 255) while it runs on. Here the process's
    ``sentinel`` is a pidfd of the worker itself, readable once it exits; the
    exit status still comes from the server, and where the server has gone it
    is unknown (``status_known`` False, exit code 255).
    """

    status_known = True
    _pidfd: Optional[int] = None

    def _launch(self, process_obj: Any) -> None:
        super()._launch(process_obj)
        self._status_fd = self.sentinel
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            return  # Seen through the server, as multiprocessing does.
        from multiprocessing import util

        self._pidfd = pidfd
        self.sentinel = pidfd
        self._pidfd_finalizer = util.Finalize(self, os.close, (pidfd,))

    def poll(self, flag: int = os.WNOHANG) -> Optional[int]:
        if self.returncode is not None or self._pidfd is None:
            return super().poll(flag)
        from multiprocessing import forkserver
        from multiprocessing.connection import wait

        if not wait([self._pidfd], 0 if flag == os.WNOHANG else None):
            return None
        code = None
        if wait([self._status_fd], _STATUS_WAIT_S):
            try:
                code = forkserver.read_signed(self._status_fd)
            except (OSError, EOFError):
                pass  # Its server has gone.
        if code is None:
            self.status_known = False
            code = UNKNOWN_EXIT_CODE
        self.returncode = code
        return code

    def close(self) -> None:
        super().close()
        if self._pidfd is not None:
            self._pidfd = None
            self._pidfd_finalizer()


def exit_status_known(proc: Any) -> bool:
    """Whether the exit code of process ``proc`` (exited) is its own, not multiprocessing's 255 for "unknown"."""
    return getattr(getattr(proc, "_popen", None), "status_known", True)


@functools.lru_cache(maxsize=None)
def _worker_popen(server: Any) -> type:
    """The forkserver ``Popen`` that launches through ``server``, with preparation data naming no main module.

    Nothing global changes, so the program's own use of multiprocessing is unaffected.
    """
    from multiprocessing import forkserver, popen_forkserver

    launching = _rebound_popen(
        popen_forkserver.Popen, "_launch", popen_forkserver, "LaunchingPopen",
        spawn=_SpawnWithoutMain(),
        forkserver=types.SimpleNamespace(
            connect_to_new_process=server.connect_to_new_process, read_signed=forkserver.read_signed
        ),
    )
    return type("WorkerPopen", (_ExitSeenThroughPidfd, launching), {"__module__": __name__})


@functools.lru_cache(maxsize=None)
def _spawn_popen() -> type:
    """The spawn ``Popen`` of this platform, with preparation data naming no main module."""
    if sys.platform == "win32":  # pragma: no cover - untested platform
        from multiprocessing import popen_spawn_win32 as module

        method = "__init__"
    else:
        from multiprocessing import popen_spawn_posix as module

        method = "_launch"
    return _rebound_popen(module.Popen, method, module, "SpawnedWorkerPopen", spawn=_SpawnWithoutMain())


class WorkerProcess(multiprocessing.context.ForkServerProcess):
    """A process one of grainlike's worker servers forks, without importing the main module."""

    @staticmethod
    def _Popen(process_obj):
        # The process object is pickled for the server: its server is kept beside it.
        return _worker_popen(server_of.pop(process_obj))(process_obj)


server_of: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class SpawnedWorkerProcess(multiprocessing.context.SpawnProcess):
    """A worker spawned as a fresh interpreter (no worker server here), without importing the main module."""

    @staticmethod
    def _Popen(process_obj):
        return _spawn_popen()(process_obj)


def server_supported() -> bool:
    """Whether workers can start from a worker server: it needs ``os.fork``, and not macOS.

    On macOS forking a process that has used the system's libraries can crash
    the child, and Python spawns by default.
    """
    return (
        hasattr(os, "fork")
        and sys.platform != "darwin"
        and "forkserver" in multiprocessing.get_all_start_methods()
    )


# grainlike's worker servers, by the modules each preloaded: one started at import
# cannot take modules the program imports later, so a pool whose sources need
# those (TFDS, datasets) gets a server that preloads them.
_servers: dict = {}


def _server_preload() -> tuple:
    """The modules a worker server should preload now: ours, and the user's forkserver preloads."""
    from multiprocessing import forkserver

    user = [m for m in getattr(forkserver._forkserver, "_preload_modules", []) if m != "__main__"]
    wanted = [WORKER_MODULE, *TASK_MODULES] + [m for m in PRELOAD_IF_LOADED if m in sys.modules]
    return tuple(wanted + [m for m in user if m not in wanted])


def running_server(start: bool = True) -> Any:
    """A running worker server preloading at least ``_server_preload()``."""
    preload = _server_preload()
    with _lock:
        server = next((s for key, s in _servers.items() if set(preload) <= set(key)), None)
        if server is None:
            server = _worker_server_class()()
            server.set_forkserver_preload(list(preload))
            _servers[preload] = server
    if start:
        server.ensure_running()
        install_exit_on_signals()  # No folder of its own or of multiprocessing may outlive the process.
    return server


# The start of the command a worker server runs (``forkserver_main``).
_SERVE_COMMAND = "from grainlike.workers.server import forkserver_main; "


@functools.lru_cache(maxsize=None)
def _worker_server_class() -> type:
    """``WorkerServer``, built on first use: importing ``multiprocessing.forkserver`` costs a socket import."""
    from multiprocessing import forkserver, resource_tracker, spawn, util

    class WorkerServer(forkserver.ForkServer):
        """multiprocessing's ``ForkServer``, running ``forkserver_main`` at grainlike's own address.

        The client side is multiprocessing's protocol (the requester's pipe ends and
        descriptors passed over the socket, the forked pid and later the exit code
        written back), spoken here by this class and by ``forkserver_main``, so that
        it does not depend on what a Python version's forkserver adds to it. The
        attributes are ``ForkServer``'s (``_forkserver_pid``, ``_forkserver_address``,
        ``_forkserver_alive_fd``).
        """

        def ensure_running(self) -> None:
            with self._lock:
                resource_tracker.ensure_running()
                if self._forkserver_pid is not None:
                    pid, _ = os.waitpid(self._forkserver_pid, os.WNOHANG)
                    if not pid:
                        return  # Still running.
                    self._forget()
                import socket

                with socket.socket(socket.AF_UNIX) as listener:
                    address = _listen_address()
                    listener.bind(address)
                    if isinstance(address, str) and not address.startswith("\0"):
                        os.chmod(address, 0o600)
                    listener.listen()
                    # Every process of the program holds the write end: when all are
                    # gone, the server reads EOF and exits.
                    alive_r, alive_w = os.pipe()
                    try:
                        command = _SERVE_COMMAND + "forkserver_main(%d, %d, %r)" % (
                            listener.fileno(), alive_r, list(self._preload_modules)
                        )
                        exe = spawn.get_executable()
                        args = [exe, *util._args_from_interpreter_flags(), "-c", command]
                        pid = util.spawnv_passfds(exe, args, [listener.fileno(), alive_r])
                    except BaseException:
                        os.close(alive_w)
                        raise
                    finally:
                        os.close(alive_r)
                self._forkserver_address = address
                self._forkserver_alive_fd = alive_w
                self._forkserver_pid = pid

        def _forget(self) -> None:
            """Drops a server that has exited (reaped already)."""
            os.close(self._forkserver_alive_fd)
            self._forkserver_address = self._forkserver_alive_fd = self._forkserver_pid = None

        def replace(self) -> None:
            """Ends this server's process (a server that refused a connection is dying or broken); the next use starts another.

            Workers it started go on: their exits are seen through pidfds.
            """
            with self._lock:
                pid = self._forkserver_pid
                if pid is None:
                    return
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
                self._forget()

        def connect_to_new_process(self, fds: list) -> tuple:
            """Asks the server for a process; returns ``(status_r, data_w)`` (see ``ForkServer``)."""
            import socket

            self.ensure_running()
            if len(fds) + 4 >= forkserver.MAXFDS_TO_SEND:
                raise ValueError("too many fds")
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(self._forkserver_address)
                parent_r, child_w = os.pipe()
                child_r, parent_w = os.pipe()
                try:
                    socket.send_fds(
                        client, [bytes([(len(fds) + 4) % 256])],
                        [child_r, child_w, self._forkserver_alive_fd, resource_tracker.getfd(), *fds],
                    )
                    return parent_r, parent_w
                except BaseException:
                    os.close(parent_r)
                    os.close(parent_w)
                    raise
                finally:
                    os.close(child_r)
                    os.close(child_w)

    return WorkerServer


# Failures to reach a worker server before it received a request (so none was
# forked): the start can be tried again. Refused or not found, the server is
# gone or going and a new one is started; reset, it dropped the connection.
SERVER_FAILURES = (ConnectionRefusedError, FileNotFoundError, ConnectionResetError, BrokenPipeError)


def recover(server: Any, error: BaseException) -> None:
    """After ``error`` starting a worker through ``server``: replaces a server that refused or vanished."""
    if isinstance(error, (ConnectionRefusedError, FileNotFoundError)) or (
        server._forkserver_pid is not None and not pid_alive(server._forkserver_pid)
    ):
        server.replace()


# On Linux a worker server listens at the abstract ``\0grainlike-srv-<pid>-<random>``:
# no file to leave behind or for another user to plant; having no permissions,
# it accepts only its own program's processes (``_check_peers``). Elsewhere the
# socket is a file in a 0700 folder ``$TMPDIR/glsrv-<pid>-<random>``, short, as
# a socket's path is at most 107 bytes.
_ABSTRACT_PREFIX = "\0grainlike-srv-"
_FOLDER_PREFIX = "glsrv-"
_folder: Optional[str] = None


def abstract_sockets() -> bool:
    """Whether worker servers listen in the abstract namespace, their peers checked by SO_PEERCRED."""
    import socket

    return sys.platform.startswith("linux") and hasattr(socket, "SO_PEERCRED")


def _abstract_address() -> str:
    import secrets

    return f"{_ABSTRACT_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"


def _listen_address() -> Any:
    """Where a new worker server listens: an abstract address, else a socket file in this process's folder.

    Not multiprocessing's ``pymp-*`` folder, which nothing removes if the program
    and its server are killed together; ours a later program sweeps.
    """
    if abstract_sockets():
        return _abstract_address()
    import secrets

    try:
        return os.path.join(_socket_folder(), f"listener-{secrets.token_hex(4)}")
    except OSError:
        # A socket path too long for AF_UNIX under a deep $TMPDIR: multiprocessing's own folder.
        from multiprocessing import connection

        return connection.arbitrary_address("AF_UNIX")


def _sweep_dead_folders(parent: str) -> None:
    """Removes the socket folders of this user's processes that have gone.

    A server killed together with its program cannot remove its folder; the next
    program does. Only real folders owned by this user, named for a process
    that no longer exists, holding nothing but sockets; no link is followed.
    """
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        found = re.fullmatch(re.escape(_FOLDER_PREFIX) + r"(\d+)-\w+", name)
        if found is None or pid_alive(int(found.group(1))):
            continue
        folder = os.path.join(parent, name)
        try:
            st = os.lstat(folder)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                for entry in os.listdir(fd):
                    if stat.S_ISSOCK(os.lstat(entry, dir_fd=fd).st_mode):
                        os.unlink(entry, dir_fd=fd)
            finally:
                os.close(fd)
            os.rmdir(folder)  # Only if empty: anything else put there stays.
        except OSError:
            continue


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


# The longest socket path every platform takes (macOS: 104 bytes with the NUL).
_MAX_SOCKET_PATH = 103


def _socket_folder() -> str:
    global _folder
    if _folder is None or not os.path.isdir(_folder):
        parent = tempfile.gettempdir()
        # mkdtemp's and multiprocessing's random parts are 8 characters each.
        longest = len(os.path.join(parent, f"{_FOLDER_PREFIX}{os.getpid()}-{'x' * 8}", f"listener-{'x' * 8}"))
        if longest > _MAX_SOCKET_PATH:
            raise OSError(
                errno.ENAMETOOLONG,
                f"grainlike's worker server listens on a Unix socket in TMPDIR ({parent!r}), whose path "
                f"would be {longest} characters, more than the {_MAX_SOCKET_PATH} a socket address takes; "
                "set TMPDIR to a shorter folder (e.g. /tmp)",
            )
        _sweep_dead_folders(parent)
        _folder = tempfile.mkdtemp(prefix=f"{_FOLDER_PREFIX}{os.getpid()}-", dir=parent)
    return _folder


# Signals whose default action skips exit handlers, leaving multiprocessing's
# ``$TMPDIR/pymp-*`` folder behind (SIGINT raises KeyboardInterrupt: they run).
_EXIT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
# The process whose handlers are installed (a forked child inherits them).
_handlers_pid = None
# What grainlike closes before multiprocessing's exit handler runs (its pools).
exit_cleanups: list = []


def install_exit_on_signals() -> None:
    """Cleans up, then ends the process as the signal would, on SIGTERM and SIGHUP.

    Only where the signal's disposition is the default (a handler the user
    installed is left alone), only from the main thread, once per process. The
    handler closes grainlike's worker pools and runs multiprocessing's exit
    handler (which removes its temporary folder), then sends the signal again
    with the default disposition, so the exit status is unchanged.
    """
    global _handlers_pid
    if _handlers_pid == os.getpid() or threading.current_thread() is not threading.main_thread():
        return
    _handlers_pid = os.getpid()
    _replace_handlers(signal.SIG_DFL, exit_on_signal)


def _replace_handlers(old: Any, new: Any) -> None:
    """Makes ``new`` the handler of each exit signal whose handler is ``old``."""
    for sig in _EXIT_SIGNALS:
        try:
            if signal.getsignal(sig) is old:
                signal.signal(sig, new)
        except (OSError, ValueError):
            pass  # Not settable here (not the main thread, an embedded interpreter).


def default_exit_signals() -> None:
    """Puts back the default for exit signals handled by ``exit_on_signal`` (in a worker, a forked child).

    A process stuck in C code (a lock another thread of the parent held at fork
    time) never runs a Python handler: ``Pool.terminate()`` would not end it.
    """
    _replace_handlers(exit_on_signal, signal.SIG_DFL)


def exit_on_signal(signum: int, frame: Any) -> None:
    """The handler ``install_exit_on_signals`` installs: cleanup, then the default action."""
    try:
        if os.getpid() == _handlers_pid:
            for cleanup in list(exit_cleanups):
                try:
                    cleanup()
                except Exception:
                    pass  # The signal still ends the process.
            from multiprocessing import util

            util._exit_function()
    finally:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def server_fds() -> set:
    """The descriptors grainlike's worker servers keep open for the life of the process."""
    return {fd for s in list(_servers.values()) if (fd := getattr(s, "_forkserver_alive_fd", None)) is not None}


def _started_by_multiprocessing() -> bool:
    """Whether this interpreter is one multiprocessing started (a forkserver, ours too; a spawned child)."""
    if multiprocessing.parent_process() is not None:
        return True
    argv = list(getattr(sys, "orig_argv", sys.argv))
    # ``python -c "from multiprocessing.X import ..."``, spawned ones with
    # ``--multiprocessing-fork`` after it (they import grainlike before parent_process() is set).
    if argv and argv[-1] == "--multiprocessing-fork":
        argv.pop()
    return len(argv) >= 2 and argv[-2] == "-c" and argv[-1].startswith(("from multiprocessing.", _SERVE_COMMAND))


def start_server_early() -> None:
    """Starts the worker server when grainlike is imported, so that it is ready by the first ``iter()``.

    The program's set-up after the import (JAX, files, OpenCV) starts threads,
    after which workers start from the server (``fork_is_safe``); its boot
    (~0.3 s of one core) then overlaps that set-up. It costs the importing
    process one ``fork_exec``. Not in processes multiprocessing starts (each
    would start another), nor where there is no server (``server_supported``).
    """
    if server_supported() and not _started_by_multiprocessing():
        start_quietly()


def start_quietly() -> None:
    """Starts a worker server if none is running; a failure is reported when workers start."""
    try:
        running_server()
    except Exception:
        pass


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


def proc_stat(pid: int) -> list:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...); [] if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode("ascii", "replace").split()
    except (OSError, IndexError):
        return []


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


def _after_fork_in_child() -> None:
    """A forked child starts a server of its own when it needs one: the parent's is the parent's."""
    global _lock, _handlers_pid, _folder
    _lock = threading.Lock()
    _folder = None  # The parent's; named for the parent's pid.
    _handlers_pid = None  # The child installs its own handlers when it starts workers.
    default_exit_signals()
    for server in _servers.values():
        alive_fd = getattr(server, "_forkserver_alive_fd", None)
        if alive_fd is not None:
            try:
                os.close(alive_fd)  # The parent keeps its own copy.
            except OSError:
                pass
    _servers.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
