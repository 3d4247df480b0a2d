"""User code that misbehaves towards its process: exits, forks, lies about time, hangs.

Kept apart from the test modules so that worker processes, which import the
module a transform class lives in, import only numpy and grainlike.
"""

import os
import sys
import time

import numpy as np

import grainlike as grain


class ExitAt(grain.MapTransform):
    """On element ``at``: ``sys.exit(3)``, ``os._exit(4)`` or ``raise KeyboardInterrupt``; ``at=None``: never."""

    def __init__(self, how, at=13):
        self.how = how
        self.at = at

    def map(self, x):
        if int(x) == self.at:
            if self.how == "sys.exit":
                sys.exit(3)
            if self.how == "os._exit":
                os._exit(4)
            raise KeyboardInterrupt
        return x


class ForkAt(grain.MapTransform):
    """On element ``at``, forks; the child writes its pid to ``pid_file``, then goes on
    as if it were the parent (``"carry_on"``) or sleeps for 10 minutes (``"linger"``)."""

    def __init__(self, at, child, pid_file):
        self.at = at
        self.child = child
        self.pid_file = pid_file

    def map(self, x):
        if int(x) != self.at:
            return x
        # The parent goes on once the child has written its pid: otherwise the
        # worker may end, and the child with it, before the file names it.
        written_r, written_w = os.pipe()
        if os.fork() == 0:
            os.close(written_r)
            with open(self.pid_file, "a") as f:
                f.write(f"{os.getpid()}\n")
            os.write(written_w, b"1")
            os.close(written_w)
            if self.child == "linger":
                time.sleep(600)
                os._exit(0)
            return x
        os.close(written_w)
        os.read(written_r, 1)
        os.close(written_r)
        return x


class ForkAndWait(grain.MapTransform):
    """Forks a child that forks a grandchild; each ends with os._exit, and the element is the grandchild's status."""

    def map(self, x):
        pid = os.fork()
        if pid == 0:
            grandchild = os.fork()
            if grandchild == 0:
                os._exit(int(x) % 50)
            _, status = os.waitpid(grandchild, 0)
            os._exit(os.waitstatus_to_exitcode(status))
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)


class ClockForwardThenHang(grain.MapTransform):
    """On element ``at``: moves the worker's clock a day ahead, works for a while, then hangs."""

    def __init__(self, at):
        self.at = at

    def map(self, x):
        if int(x) == self.at:
            real = time.monotonic
            time.monotonic = lambda: real() + 86400.0
            end = real() + 1.0
            while real() < end:  # Busy: the worker is seen moving, with its clock a day ahead.
                sum(range(1000))
            time.sleep(600)
        return x


class Sleep(grain.MapTransform):
    """Sleeps ``seconds`` on every element from ``first_slow`` on (on every one by default)."""

    def __init__(self, seconds, first_slow=0):
        self.seconds = seconds
        self.first_slow = first_slow

    def map(self, x):
        if x >= self.first_slow:
            time.sleep(self.seconds)
        return x


class Rows(grain.MapTransform):
    """A 256 KiB float32 array per element, filled with it: large enough to travel in shared memory."""

    def map(self, x):
        return np.full((256, 256), int(x), np.float32)


class RowsRaisingAt(Rows):
    """``Rows``, raising ``ValueError`` on element ``at``."""

    def __init__(self, at):
        self.at = at

    def map(self, x):
        if int(x) == self.at:
            raise ValueError(f"element {int(x)} fails")
        return super().map(x)


def first(x) -> int:
    """The element a delivered output stands for (an int, or an array filled with it)."""
    return int(np.asarray(x).ravel()[0])
