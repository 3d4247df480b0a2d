"""Checks that a test left no worker process, thread or shared-memory segment."""

from __future__ import annotations

import os
import threading
import time

import psutil


def shm_entries(prefix: str = "grainlike_") -> set:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}
    except OSError:
        return set()


def _helper_process(p: psutil.Process) -> bool:
    # multiprocessing's forkserver and resource tracker are long-lived by design.
    try:
        cmd = " ".join(p.cmdline())
    except (psutil.Error, OSError):
        return True
    return "forkserver" in cmd or "resource_tracker" in cmd


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


def grainlike_threads() -> set:
    return {t.name for t in threading.enumerate() if t.name.startswith("grainlike")}


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
        self.shm = shm_entries()
        self.children = worker_children()
        self.threads = grainlike_threads()

    def assert_clean(self, timeout: float = 5.0) -> None:
        import gc

        gc.collect()
        assert wait_until(lambda: worker_children() <= self.children, timeout), (
            f"worker processes left: {worker_children() - self.children}"
        )
        assert wait_until(lambda: shm_entries() <= self.shm, timeout), (
            f"shared-memory segments left: {shm_entries() - self.shm}"
        )
        assert wait_until(lambda: grainlike_threads() <= self.threads, timeout), (
            f"threads left: {grainlike_threads() - self.threads}"
        )
