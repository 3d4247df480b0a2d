"""What the user's code in a worker may not do to it: end it unreported, or fork a second worker.

``ExitReports``: ``sys.exit()``, ``os._exit()`` or ``KeyboardInterrupt`` in the
user's code ends the worker only after an ``EXIT`` report naming where
(``exit_report``). ``ForkedFromWorker``: a process the user's code forks never
delivers an output and ends with the worker. Both run in worker processes only.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from grainlike.workers.messages import EXIT


# os._exit as the interpreter defines it: a worker replaces ``os._exit`` for the
# user's code (``ExitReports``); its own exits use this.
real_exit = os._exit


def exit_code(error: BaseException) -> int:
    """The exit status the interpreter would end with for ``error`` raised to the top (1 for what is not SystemExit)."""
    if not isinstance(error, SystemExit):
        return 1
    code = error.code
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        return 1
    return code or 0


def exit_now(code: int) -> None:
    """Ends this process at once with ``code``, its output flushed."""
    sys.stdout.flush()
    sys.stderr.flush()
    real_exit(code)


def _code_frames(tb: Any = None, frame: Any = None) -> list:
    """``(filename, line, qualified name)`` of a traceback's frames, or of a stack from ``frame`` out; innermost last."""
    out = []
    while tb is not None:
        code = tb.tb_frame.f_code
        out.append((code.co_filename, tb.tb_lineno, getattr(code, "co_qualname", code.co_name)))
        tb = tb.tb_next
    stack = []
    while frame is not None:
        code = frame.f_code
        stack.append((code.co_filename, frame.f_lineno, getattr(code, "co_qualname", code.co_name)))
        frame = frame.f_back
    return out + stack[::-1]


def _user_frame(frames: list) -> str:
    """The innermost frame outside grainlike and the standard library: where the user's code was."""
    import sysconfig

    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    stdlib = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
    for filename, line, name in reversed(frames):
        if not os.path.abspath(filename).startswith((ours, stdlib)):
            return f"{name} ({filename}, line {line})"
    if not frames:
        return "an unknown place"
    filename, line, name = frames[-1]
    return f"{name} ({filename}, line {line})"


def exit_report(state: Any, code: int, what: str, tb: Any = None, frame: Any = None, notes: Any = ()) -> tuple:
    """An ``EXIT`` message: the user's code ended the worker (``what``: ``sys.exit(3)``, ``os._exit(4)``...).

    Where: the traceback ``tb`` of the exception that ends it, or the stack from ``frame`` out.
    """
    import traceback

    frames = _code_frames(tb, frame)
    summaries = traceback.extract_tb(tb) if tb is not None else traceback.extract_stack(frame)
    stack = "".join(traceback.format_list(summaries)).rstrip()
    return (EXIT, state, code, what, _user_frame(frames), [str(n) for n in notes], stack)


class ForkedFromWorker:
    """What a process forked by the user's code inside a worker may still do: nothing of the worker's.

    The child of ``os.fork()`` in a transform is a copy of the worker, down to its
    socket to the consumer and its shared-memory segments. At the fork (an
    ``os.register_at_fork`` handler, run by ``os.fork`` and multiprocessing's
    fork alike), its copies of the worker's results socket and control pipe
    are replaced by ``/dev/null``, so no byte it writes reaches the consumer and
    it takes no message meant for the worker, and it is set to be killed when
    the worker's thread that forked it ends (``PR_SET_PDEATHSIG``), so nothing
    it leaves outlives the job. Should it go on into the worker's loop (the
    transform returned in the child), ``check()`` ends it at the first step
    that belongs to the worker: allocating an output's memory, sending.
    """

    def __init__(self, worker_index: int, fds: list):
        self.pid = os.getpid()
        self._worker_index = worker_index
        self._fds = fds
        self._prctl = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                self._prctl = ctypes.CDLL(None).prctl  # Looked up now: the child only calls it.
            except (ImportError, OSError, AttributeError):
                pass
        self._forking = 0  # The process about to fork (the worker, or a process it forked).
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(before=self._before_fork, after_in_child=self._after_fork_in_child)

    def _before_fork(self) -> None:
        self._forking = os.getpid()

    def _after_fork_in_child(self) -> None:
        if os.getpid() == self.pid:
            return
        try:
            null = os.open(os.devnull, os.O_RDWR)
            try:
                for fd in self._fds:
                    os.dup2(null, fd)
            finally:
                os.close(null)
        except OSError:
            pass
        if self._prctl is not None:
            self._prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
            if os.getppid() != self._forking:
                real_exit(0)  # Its parent died before the signal was set: it would never come.

    def check(self) -> None:
        """Ends this process if it is not the worker itself but a copy the user's code forked."""
        if os.getpid() == self.pid:
            return
        try:
            print(
                f"grainlike: process {os.getpid()}, forked by the user's code in worker "
                f"{self._worker_index} (pid {self.pid}), went on into the worker's loop; it "
                "ends here, as only the worker delivers outputs (a forked child should end "
                "with os._exit())",
                file=sys.stderr, flush=True,
            )
        finally:
            real_exit(0)


class ExitReports:
    """In a worker: ``os._exit`` called by the user's code tells the consumer why the worker ends.

    While the worker runs its task, ``os._exit`` is replaced by a function that
    sends an ``EXIT`` report (the caller's stack, the worker's state) before the
    process ends as ``os._exit`` ends it. A process the user's code forked
    (``os._exit`` is how it should end) exits at once, reporting nothing.
    """

    def __init__(self, outbox: Any, own: ForkedFromWorker):
        self._outbox = outbox  # main's _Outbox
        self._own = own
        self.running = False  # The task is running: an os._exit now is the user's.
        self.state: Any = None  # The state after the worker's last output.

    def install(self) -> None:
        os._exit = self._exit

    def _exit(self, code: int) -> None:
        if self.running and os.getpid() == self._own.pid:
            try:
                report = exit_report(self.state, code, f"os._exit({code!r})", frame=sys._getframe(1))
                self._outbox.send_last(report, timeout=1.0)
            except BaseException:  # noqa: B902 - the exit happens whatever the report does
                pass
        real_exit(code)


def what_ended(error: BaseException) -> str:
    """How the user's code ended the worker, as it was written: ``sys.exit(3)``, ``KeyboardInterrupt``."""
    if isinstance(error, SystemExit):
        return f"sys.exit({error.code!r})" if error.code is not None else "sys.exit()"
    return type(error).__name__
