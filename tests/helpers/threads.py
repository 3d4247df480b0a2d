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
