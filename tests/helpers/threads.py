"""A ``next()`` that runs in another thread, for tests of a blocked consumer."""

from __future__ import annotations

import threading
from typing import Any, Iterator


def next_in_thread(it: Iterator[Any]) -> tuple[threading.Thread, dict]:
    """Starts a thread calling ``next(it)``; the dict gets its ``"value"`` or ``"error"``."""
    outcome: dict = {}

    def consume() -> None:
        try:
            outcome["value"] = next(it)
        except BaseException as e:  # noqa: B902 - reported to the test
            outcome["error"] = e

    consumer = threading.Thread(target=consume)
    consumer.start()
    return consumer, outcome


def read_threads() -> set:
    """The read threads alive now (objects: names repeat across pools)."""
    return {t for t in threading.enumerate() if t.name.startswith("grainlike-read")}


def new_read_threads(before: set) -> set:
    """Names of read threads alive now that were not in ``before``: an earlier
    test's dropped iterator may still be ending its own."""
    return {t.name for t in read_threads() - before}
