"""The worker server: where workers start when they cannot fork from the program.

A ``multiprocessing`` forkserver of grainlike's own (the process-wide one stays
the program's) that has preloaded ``main``, booted when grainlike is imported
(``start_server_early``). Workers it forks, or spawns where there is no server
(``server_supported``), get preparation data naming no main module, so they never
re-run the user's ``__main__``. Importing this module costs the standard library only.
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
import sys
import tempfile
import threading
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


@functools.lru_cache(maxsize=None)
def _worker_popen(server: Any) -> type:
    """The forkserver ``Popen`` that launches through ``server``, with preparation data naming no main module.

    Nothing global changes, so the program's own use of multiprocessing is unaffected.
    """
    from multiprocessing import forkserver, popen_forkserver

    return _rebound_popen(
        popen_forkserver.Popen, "_launch", popen_forkserver, "WorkerPopen",
        spawn=_SpawnWithoutMain(),
        forkserver=types.SimpleNamespace(
            connect_to_new_process=server.connect_to_new_process, read_signed=forkserver.read_signed
        ),
    )


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
    from multiprocessing import forkserver

    preload = _server_preload()
    with _lock:
        server = next((s for key, s in _servers.items() if set(preload) <= set(key)), None)
        if server is None:
            server = forkserver.ForkServer()
            server.set_forkserver_preload(list(preload))
            _servers[preload] = server
    if start:
        _ensure_running(server)
        install_exit_on_signals()  # No folder of its own or of multiprocessing may outlive the process.
    return server


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


def _abstract_address(family: str) -> str:
    import secrets

    return f"{_ABSTRACT_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"


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


@functools.lru_cache(maxsize=None)
def _abstract_ensure_running() -> Callable[[Any], None]:
    """``ForkServer.ensure_running``, the standard library's own code, binding an abstract address."""
    from multiprocessing import connection, forkserver

    abstract = types.SimpleNamespace(**{**vars(connection), "arbitrary_address": _abstract_address})
    return _rebound(forkserver.ForkServer.ensure_running, forkserver, connection=abstract)


def _ensure_running(server: Any) -> None:
    """Starts ``server`` if it is not running: at an abstract address, else in this process's own folder.

    Not multiprocessing's ``pymp-*`` folder, which nothing removes if the program
    and its server are killed together; ours a later program sweeps.
    """
    if abstract_sockets():
        _abstract_ensure_running()(server)
        return
    from multiprocessing import process

    config = process.current_process()._config
    with _lock:
        previous = config.get("tempdir")
        config["tempdir"] = _socket_folder()
        try:
            server.ensure_running()
        except OSError:
            # A socket path too long for AF_UNIX under a deep $TMPDIR: multiprocessing's own folder.
            _restore(config, previous)
            server.ensure_running()
        finally:
            _restore(config, previous)


def _restore(config: dict, previous: Optional[str]) -> None:
    if previous is None:
        config.pop("tempdir", None)
    else:
        config["tempdir"] = previous


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
    """Whether this interpreter is one multiprocessing started (its forkserver, a spawned child)."""
    if multiprocessing.parent_process() is not None:
        return True
    argv = list(getattr(sys, "orig_argv", sys.argv))
    # ``python -c "from multiprocessing.X import ..."``, spawned ones with
    # ``--multiprocessing-fork`` after it (they import grainlike before parent_process() is set).
    if argv and argv[-1] == "--multiprocessing-fork":
        argv.pop()
    return len(argv) >= 2 and argv[-2] == "-c" and argv[-1].startswith("from multiprocessing.")


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


def _own_listener() -> Any:
    """In a worker server: the address it listens at (None in any other process)."""
    import socket

    argv = getattr(sys, "orig_argv", sys.argv)
    found = re.match(r"from multiprocessing\.forkserver import main; main\((\d+), ", argv[-1] if argv else "")
    if found is None:
        return None
    try:
        with socket.fromfd(int(found.group(1)), socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            return listener.getsockname()
    except OSError:
        return None


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


def _check_peers() -> None:
    """In a worker server at an abstract address: accepts only its own program's processes.

    An abstract socket has no owner or mode, so any local process could connect
    and have the server unpickle what it sends. ``forkserver.main``'s accept
    loop gets a socket whose ``accept`` closes every connection whose peer
    (SO_PEERCRED) is not of this uid and below the program, reporting
    ECONNABORTED, which the loop skips. Installed when the server preloads this module.
    """
    import socket
    import struct
    from multiprocessing import forkserver

    uid, program = os.getuid(), os.getppid()

    class _PeerCheckingSocket(socket.socket):
        def accept(self):
            conn, address = super().accept()
            try:
                pid, peer_uid, _ = struct.unpack(
                    "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                )
                allowed = peer_uid == uid and _in_tree(pid, program)
            except OSError:
                allowed = False
            if not allowed:
                conn.close()
                raise OSError(errno.ECONNABORTED, "grainlike worker server: a connection from another user or program was refused")
            return conn, address

    forkserver.socket = types.SimpleNamespace(**{**vars(socket), "socket": _PeerCheckingSocket})


if _started_by_multiprocessing() and multiprocessing.parent_process() is None:  # In a worker server, maybe.
    _address = _own_listener()
    if isinstance(_address, bytes) and _address.startswith(_ABSTRACT_PREFIX.encode()):
        _check_peers()
    elif isinstance(_address, str) and _address:
        _remove_own_socket_at_exit(_address)


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
