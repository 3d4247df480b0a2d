"""Running a test script in its own session, never outliving the test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Iterator


def run_in_session(args: list, timeout: float, **popen_kwargs) -> tuple[subprocess.Popen, str, str]:
    """Runs ``args`` in a new session; returns ``(finished process, stdout, stderr)``.

    On a timeout (or any error while waiting) the whole process group it started
    is killed, so no worker it forked is left behind; the error is re-raised.
    """
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        **popen_kwargs,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc, out, err


@contextlib.contextmanager
def in_session(args: list, **popen_kwargs) -> Iterator[subprocess.Popen]:
    """Starts ``args`` in a new session, text pipes on stdout and stderr, for a test to talk to.

    On leaving the block, the whole process group it started is killed if its
    leader still runs (the test may have killed it already), and the pipes are
    closed.
    """
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        **popen_kwargs,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
