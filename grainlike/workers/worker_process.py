"""The process classes workers start as, and how a served worker's exit is seen.

``WorkerProcess`` starts from one of grainlike's worker servers (``server``),
``SpawnedWorkerProcess`` as a fresh interpreter where there is none. Neither
imports the user's main module (their preparation data names none). A served
worker's exit is seen through a pidfd of its own, not through its server
(``_ExitSeenThroughPidfd``). Importing this module costs the standard library only.
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.context
import os
import sys
import types
import weakref
from typing import Any, Optional


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
