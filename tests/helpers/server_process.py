"""A storage server started on a free localhost port, in its own session, for the remote tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from typing import Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server subprocess on ``127.0.0.1:port``, ended with its whole process group.

    Args:
      name: the server, named in errors.
      command: the command line for a port (the server must listen on 127.0.0.1).
      ready_path: a path on the server that answers once it is up.
      port: the port; a free one by default (kept across restarts).
    """

    def __init__(self, name: str, command: Callable[[int], list], ready_path: str, port: int | None = None):
        self.name = name
        self._command = command
        self._ready_path = ready_path
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 30) -> None:
        """Starts the server and waits until ``ready_path`` answers."""
        self.proc = subprocess.Popen(
            self._command(self.port),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}")
            try:
                urllib.request.urlopen(self.endpoint_url + self._ready_path, timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"{self.name} did not answer on {self.endpoint_url} in {timeout} s")

    def stop(self) -> None:
        """Kills the server's process group (a paused server too) and waits for it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        """A fresh server on the same port."""
        self.stop()
        self.start()

    def pause(self, timeout: float = 10) -> None:
        """Stops the server's processes (SIGSTOP): connections open but nothing answers.

        Returns once every process of the group is stopped: a signal is delivered
        when its target next runs, which on a loaded machine may come after a
        request the test sends next.
        """
        os.killpg(self.proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while not all(state in "Tt" for state in _group_states(self.proc.pid)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}'s processes did not stop within {timeout} s")
            time.sleep(0.005)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)


def _group_states(pgid: int) -> list:
    """The scheduler state (``/proc/<pid>/stat``'s third field) of each process in group ``pgid``."""
    states = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # Gone meanwhile.
            continue
        # The command may hold spaces and parentheses: the fields start after its last ")".
        fields = stat[stat.rindex(b")") + 2 :].split()
        if int(fields[2]) == pgid:
            states.append(fields[0].decode())
    return states
