"""Checks that a test left no worker process, thread, fd or shared-memory segment.

Shared memory is both named (``/dev/shm`` entries) and anonymous (``memfd``
segments, which only this process's descriptors and mappings show; without
``memfd_create``, POSIX objects unlinked at once, ``grainlike-<pid>-<random>``).
"""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest


def shm_entries(prefix: str = "grainlike_") -> set:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}
    except OSError:
        return set()


def own_shm_entries() -> set:
    """Segments named for this process (``grainlike_<pid>_...``, ``grainlike_src_<pid>_...``).

    Other test runs on the machine create and remove their own segments meanwhile.
    """
    pid = os.getpid()
    return (
        shm_entries(f"grainlike_{pid}_")
        | shm_entries(f"grainlike_src_{pid}_")
        | shm_entries(f"grainlike-{pid}-")  # core.memfd's unlinked objects, were one left
    )


def _helper_process(p: psutil.Process) -> bool:
    # multiprocessing's forkserver and resource tracker are long-lived by design.
    try:
        cmd = " ".join(p.cmdline())
    except (psutil.Error, OSError):
        return True
    if "resource_tracker" in cmd:
        return True
    if "forkserver" not in cmd:
        return False
    # A process forked by a server has the server's command line: a worker,
    # unless its parent is not a server (then it is the server itself).
    try:
        parent = p.parent()
        return parent is None or "forkserver" not in " ".join(parent.cmdline())
    except (psutil.Error, OSError):
        return True


def worker_children() -> set:
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE or _helper_process(p):
                continue
        except psutil.Error:
            continue
        out.add(p.pid)
    return out


def process_ended(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie or gone): ``worker_children``
    leaves out workers forked by a worker server, whose command line is the server's."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def session_processes(sid: int) -> list:
    """Live processes of session ``sid`` (a script started with ``start_new_session=True``)."""
    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (OSError, psutil.Error):
            pass
    return out


def grainlike_threads() -> set:
    return {t.name for t in threading.enumerate() if t.name.startswith("grainlike")}


def open_fds() -> dict:
    """This process's open file descriptors: fd -> what it refers to."""
    out = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in names:
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass  # Closed meanwhile (e.g. the listing's own descriptor).
    return out


def _long_lived_fds() -> set:
    # multiprocessing's forkserver and resource tracker keep one pipe each open for
    # the life of the process once started (by whichever test came first).
    # So do grainlike's worker servers.
    from multiprocessing import forkserver, resource_tracker

    from grainlike.workers import server as worker_server

    fds = {
        getattr(forkserver._forkserver, "_forkserver_alive_fd", None),
        getattr(resource_tracker._resource_tracker, "_fd", None),
    }
    return {fd for fd in fds if fd is not None} | worker_server.server_fds()


# What the worker machinery opens: pipes and sockets to workers, shared memory.
# Files a source still held by the test keeps open are not leaks.
_WORKER_FD_KINDS = ("pipe:", "socket:", "anon_inode:", "/dev/shm/")


def new_fds(before: dict) -> dict:
    """Pipes, sockets and shared-memory descriptors open now but not in ``before``."""
    keep = _long_lived_fds()
    return {
        fd: target for fd, target in open_fds().items()
        if before.get(fd) != target and fd not in keep and target.startswith(_WORKER_FD_KINDS)
    }


# grainlike names every anonymous segment it makes ``grainlike-...``; the kernel
# shows them as ``/memfd:grainlike-... (deleted)``, or, without memfd_create,
# as ``/dev/shm/grainlike-<pid>-<random> (deleted)``.
_MEMFD_MARK = "/memfd:grainlike"
_UNLINKED_MARK = "/dev/shm/grainlike-"


def is_anonymous_segment(target: str) -> bool:
    """Whether a descriptor's target or a ``/proc/<pid>/maps`` line is one of grainlike's anonymous segments."""
    return _MEMFD_MARK in target or (_UNLINKED_MARK in target and target.endswith("(deleted)"))


def memfd_fds() -> int:
    """How many descriptors of anonymous segments this process holds."""
    return sum(is_anonymous_segment(target) for target in open_fds().values())


def memfd_mappings() -> int:
    """How many mappings of anonymous segments this process has."""
    try:
        with open("/proc/self/maps") as f:
            return sum(is_anonymous_segment(line.rstrip("\n")) for line in f)
    except OSError:
        return 0


def memfd_usage() -> tuple:
    """``(descriptors, mappings)`` of anonymous segments in this process."""
    return memfd_fds(), memfd_mappings()


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


class LeakCheck:
    """Snapshot before; ``assert_clean()`` after (waits a little for exits)."""

    def __init__(self):
        self.shm = own_shm_entries()
        self.children = worker_children()
        self.threads = grainlike_threads()
        self.fds = open_fds()
        # Counts, not identities: a source the test module keeps alive holds its
        # mapping from before the test, and only growth is a leak.
        self.memfd = memfd_usage()

    def _memfd_within_baseline(self) -> bool:
        import gc

        if all(now <= then for now, then in zip(memfd_usage(), self.memfd)):
            return True
        # A segment is unmapped when its last array is collected.
        gc.collect()
        return all(now <= then for now, then in zip(memfd_usage(), self.memfd))

    def assert_clean(self, timeout: float = 5.0) -> None:
        import gc

        gc.collect()
        assert wait_until(lambda: worker_children() <= self.children, timeout), (
            f"worker processes left: {worker_children() - self.children}"
        )
        assert wait_until(lambda: own_shm_entries() <= self.shm, timeout), (
            f"shared-memory segments left: {own_shm_entries() - self.shm}"
        )
        assert wait_until(lambda: grainlike_threads() <= self.threads, timeout), (
            f"threads left: {grainlike_threads() - self.threads}"
        )
        assert wait_until(lambda: not new_fds(self.fds), timeout), (
            f"file descriptors left: {new_fds(self.fds)}"
        )
        assert wait_until(self._memfd_within_baseline, timeout), (
            "anonymous shared memory left (memfd descriptors, mappings): "
            f"{memfd_usage()}, before the test {self.memfd}"
        )


@pytest.fixture
def no_leaks():
    """Fails the test if it left worker processes, threads, fds or segments (named or anonymous) behind."""
    check = LeakCheck()
    yield check
    check.assert_clean()
