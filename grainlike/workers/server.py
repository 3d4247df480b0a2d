"""The worker server: where workers start when they cannot fork from the program.

A forkserver of grainlike's own (the process-wide one stays the program's) that
has preloaded ``main``, booted when grainlike is imported (``start_server_early``).
It speaks multiprocessing's forkserver protocol (``WorkerServer``) with a loop of
its own (``server_loop.forkserver_main``) that no peer can stop or block; the
workers it starts are watched through pidfds, not through it
(``worker_process``), so its death is no worker's. Workers it forks, or spawns
where there is no server (``server_supported``), get preparation data naming no
main module, so they never re-run the user's ``__main__``. Importing this
module costs the standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import multiprocessing
import os
import re
import signal
import stat
import sys
import tempfile
import threading
from typing import Any, Iterator, Optional

WORKER_MODULE = "grainlike.workers.main"
# What a worker imports before its first output, preloaded by name (this layer
# imports nothing above it); nothing more, as the server's boot can be on the
# first batch's path (W4c in docs/performance.md).
TASK_MODULES = (
    "grainlike.workers.start",
    "grainlike.loader.records",
    "grainlike.loader.record_transforms",
    "grainlike.loader.output_stages",
    "grainlike.loader.elastic_restore",
    "grainlike.dataset.parallel.process_prefetch",
    "grainlike.dataset.parallel.worker_slice_task",
    "grainlike.dataset.sources.source",
    "grainlike.dataset.transformations.mix",
    "grainlike.dataset.transformations.slice",
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


# The start of the command a worker server runs (``forkserver_main``). Ctrl-C is
# the program's: the server starts with SIGINT blocked (``sigint_held``),
# ignores it before its first import, then unblocks it (a pending one is dropped),
# so that a Ctrl-C while it boots, even during the interpreter's own start-up,
# prints the program's traceback only, not one of its own.
_SERVE_COMMAND = (
    "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "from grainlike.workers.server_loop import forkserver_main; "
)


@contextlib.contextmanager
def sigint_held() -> Iterator[None]:
    """Holds back a Ctrl-C while a child process starts; it is raised once the block ends.

    SIGINT is blocked in this thread, and the signal mask survives ``fork`` and
    ``exec``: a child started in the block starts with it blocked, so a Ctrl-C sent
    to the process group while its interpreter starts, or while a forked child runs
    its at-fork hooks, stays pending there until the child ignores it and unblocks
    it (the worker server, ``main.run``), which drops it. In the main thread
    Python's handler is also replaced for the block by one that only notes the
    signal, which is raised again at the end: another thread may take a SIGINT
    this thread blocks, and the ``KeyboardInterrupt`` the main thread would raise
    in ``fork``'s at-fork hooks is printed and dropped there. A Ctrl-C is never
    lost: it reaches the program once the child is started (and registered).
    """
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    noted: list = []
    handler = None
    if threading.current_thread() is threading.main_thread():
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
        else:
            handler = None
    try:
        yield
    finally:
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        if noted:
            signal.raise_signal(signal.SIGINT)


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
                        with sigint_held():
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
# it accepts only its own program's processes (``server_loop``). Elsewhere the
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

    # (Under a $TMPDIR too deep for a socket's path: a clear OSError, from _socket_folder.)
    return os.path.join(_socket_folder(), f"listener-{secrets.token_hex(4)}")


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


def proc_stat(pid: int) -> list:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...); [] if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode("ascii", "replace").split()
    except (OSError, IndexError):
        return []


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
