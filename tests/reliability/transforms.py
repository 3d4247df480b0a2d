"""Transforms for the reliability tests.

Kept apart from the test modules so that worker processes, which import the
module a transform class lives in, import only numpy and grainlike (not pytest or
hypothesis, which would make every worker start slow).
"""

import json
import time

import numpy as np

import grainlike as grain


class Plus(grain.MapTransform):
    def map(self, x):
        return x + 1000


class Decode(grain.MapTransform):
    """Parses a JSON record."""

    def map(self, record):
        return {"id": np.int64(json.loads(record)["id"])}


class OddShapeAt(grain.MapTransform):
    def __init__(self, bad):
        self.bad = bad

    def map(self, x):
        return {"x": np.zeros(3 if x == self.bad else 2, np.float32), "y": np.int32(x)}


class OddStructureAt(grain.MapTransform):
    def __init__(self, bad):
        self.bad = bad

    def map(self, x):
        if x == self.bad:
            return {"x": np.zeros(2, np.float32)}
        return {"x": np.zeros(2, np.float32), "y": np.int32(x)}


class BigOddShapeAt(grain.MapTransform):
    """Leaves large enough to be stacked straight into shared memory."""

    def __init__(self, bad):
        self.bad = bad

    def map(self, x):
        return np.zeros((129 if x == self.bad else 128, 128), np.float32)


class MixedDtypeAt(grain.MapTransform):
    def __init__(self, bad):
        self.bad = bad

    def map(self, x):
        dtype = np.float64 if x == self.bad else np.int32
        return {"x": np.full((200, 100), x, dtype)}


class KeepAll(grain.FilterTransform):
    def filter(self, x):
        return True


class Slow(grain.MapTransform):
    def __init__(self, seconds):
        self.seconds = seconds

    def map(self, x):
        time.sleep(self.seconds)
        return x


class Big(grain.MapTransform):
    """256 KiB float32 records: batches travel through shared memory."""

    def map(self, x):
        return np.full((256, 256), float(x), np.float32)


class StuckAt(grain.MapTransform):
    """Gets stuck on record ``at``: sleeps, or waits on a lock it already holds."""

    def __init__(self, at, how="sleep"):
        self.at = at
        self.how = how

    def map(self, x):
        if x == self.at:
            if self.how == "sleep":
                time.sleep(600)
            else:
                import threading

                lock = threading.Lock()
                lock.acquire()
                lock.acquire()  # deadlock
        return x


class Spin(grain.MapTransform):
    """Busy for ``seconds`` in Python on record ``at``: slow, but never stuck."""

    def __init__(self, at, seconds):
        self.at = at
        self.seconds = seconds

    def map(self, x):
        if x == self.at:
            end = time.monotonic() + self.seconds
            total = 0
            while time.monotonic() < end:
                total += sum(range(100))
        return x


class StrFails(Exception):
    """An exception that cannot be printed."""

    def __str__(self):
        raise RuntimeError("__str__ of StrFails fails")


class HoldsLock(Exception):
    """An exception that cannot be pickled."""

    def __init__(self, message):
        super().__init__(message)
        import threading

        self.lock = threading.Lock()


class NeedsTwo(Exception):
    """An exception that pickles but cannot be rebuilt from its pickle."""

    def __init__(self, a, b):
        super().__init__(f"{a}-{b}")


class StrFailsHoldsLock(StrFails, HoldsLock):
    """Neither printable nor picklable."""


def _unsendable_type():
    import threading

    class Local(Exception):
        lock = threading.Lock()  # The class itself cannot be pickled by value.

    return Local("local message")


EXCEPTIONS = {
    "str_fails": lambda: StrFails("hidden"),
    "holds_lock": lambda: HoldsLock("held lock message"),
    "needs_two": lambda: NeedsTwo(1, 2),
    "str_fails_holds_lock": lambda: StrFailsHoldsLock("hidden too"),
    "unsendable_type": _unsendable_type,
}


class RaiseAt(grain.MapTransform):
    """Raises ``EXCEPTIONS[kind]()`` on record ``at``."""

    def __init__(self, kind, at=3):
        self.kind = kind
        self.at = at

    def map(self, x):
        if x == self.at:
            raise EXCEPTIONS[self.kind]()
        return x


class UnpicklableOutputAt(grain.MapTransform):
    """On record ``at``, outputs a lock, or an object of a class defined in ``__main__``."""

    def __init__(self, kind, at=3):
        self.kind = kind
        self.at = at

    def map(self, x):
        if x != self.at:
            return {"x": np.int64(x), "extra": np.int64(0)}
        if self.kind == "lock":
            import threading

            return {"x": np.int64(x), "extra": threading.Lock()}
        point = type("Point", (), {"__module__": "__main__"})  # as a class in a script
        return {"x": np.int64(x), "extra": point()}
