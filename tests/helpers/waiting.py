"""Work that waits (a sleep per record), counting how many calls overlap in each process.

A record or element carries ``overlap``: the most calls that were sleeping at
once in its process up to its own call. More than one is what read threads
do; the rest of each record depends only on its key, so a run without the
sleep (``delay=0``) gives the same keys and states for comparison. The counter
lives in this module, so each worker process (which imports it by reference)
counts its own calls.
"""

from __future__ import annotations

import threading
import time

import numpy as np

_lock = threading.Lock()
_active = 0
_peak = 0


def wait(delay: float) -> int:
    """Sleeps ``delay`` seconds; returns the most overlapping calls in this process so far."""
    global _active, _peak
    with _lock:
        _active += 1
        _peak = max(_peak, _active)
        peak = _peak
    try:
        if delay:
            time.sleep(delay)
    finally:
        with _lock:
            _active -= 1
    return peak


def reset() -> None:
    """Forgets the overlap seen in this process so far."""
    global _peak
    with _lock:
        _peak = 0


class WaitingSource:
    """Records ``{"key": k, "overlap": n}``; each read of a key sleeps ``delay`` seconds.

    Its repr leaves out the delay: a loader compares it on restore, and runs with
    and without the sleep hold the same records.
    """

    def __init__(self, n: int, delay: float = 0.01):
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: int) -> dict:
        return {"key": np.int64(key), "overlap": np.int64(wait(self.delay))}

    def __repr__(self) -> str:
        return f"WaitingSource(n={self.n})"


class WaitingMap:
    """``x -> {"x": x, "overlap": n}``, sleeping ``delay`` seconds per element (a plain callable)."""

    def __init__(self, delay: float = 0.01):
        self.delay = delay

    def __call__(self, x):
        return {"x": x, "overlap": wait(self.delay)}


def keys(outputs: list, field: str) -> list:
    """``field`` of every output (a record, an element or a batch of them), as plain lists."""
    return [np.asarray(o[field]).tolist() for o in outputs]


def max_overlap(outputs: list) -> int:
    return max(int(np.max(np.asarray(o["overlap"]))) for o in outputs)
