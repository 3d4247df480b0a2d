"""Only the program that started a worker server, and processes below it, get workers from it.

The server listens in Linux's abstract socket namespace, which has no owner or
mode: any local process can connect. Connecting peers are checked by
SO_PEERCRED; a refused one gets no process forked and no byte of the server
read. The attacker below speaks the forkserver's own protocol (two pipe ends
passed over the socket, the forked pid written back), once as another user
(``nobody``, through ``setpriv``; needs root), once as this user from outside
the program's process tree, and once as the program's own child, which must be
served (so that the refusals are the check's, not a broken client).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.processes import in_session

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets and SO_PEERCRED are Linux's"),
]

NOBODY = 65534

# argv[1]: the server's address, hex-encoded (it starts with a NUL byte).
_ATTACKER = r"""
import os, socket, sys
from multiprocessing import reduction

address = bytes.fromhex(sys.argv[1])
parent_r, child_w = os.pipe()
child_r, parent_w = os.pipe()
try:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(address)
        reduction.sendfds(s, [child_r, child_w])
except OSError as e:
    print("REFUSED", type(e).__name__, flush=True)
    sys.exit(0)
os.close(child_r)
os.close(child_w)
os.close(parent_w)  # A forked child reads EOF and exits.
pid = os.read(parent_r, 8)
print("FORKED" if pid else "REFUSED", flush=True)
"""

# The program: starts a worker server, lets its own child attack it, then waits.
_PROGRAM = r"""
import subprocess, sys
from grainlike.workers import server

s = server.running_server()
print(s._forkserver_address.encode().hex(), flush=True)
sys.stdin.readline()
child = subprocess.run([sys.executable, "-c", sys.argv[1], s._forkserver_address.encode().hex()],
                       capture_output=True, text=True, timeout=60)
print("child", child.stdout.strip(), child.stderr.strip()[-300:], flush=True)
print("alive", s._forkserver_pid is not None and __import__("os").waitpid(s._forkserver_pid, __import__("os").WNOHANG)[0] == 0, flush=True)
"""


def _attack(address: str, *prefix: str) -> str:
    done = subprocess.run(
        [*prefix, sys.executable, "-c", _ATTACKER, address], capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[0]


_AS_NOBODY = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")


@pytest.mark.parametrize(
    "attacker",
    [
        pytest.param(
            _AS_NOBODY, id="another_user",
            marks=pytest.mark.skipif(os.geteuid() != 0, reason="acting as another local user (setpriv --reuid) needs root"),
        ),
        pytest.param((), id="this_user_outside_the_program"),
    ],
)
def test_only_the_programs_own_processes_get_workers_from_its_server(attacker):
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "JAX_PLATFORMS": "cpu"}
    with in_session([sys.executable, "-c", _PROGRAM, _ATTACKER], env=env, stdin=subprocess.PIPE) as proc:
        address = proc.stdout.readline().strip()
        assert bytes.fromhex(address).startswith(b"\0grainlike-srv-"), (address, proc.stderr.read())
        assert _attack(address, *attacker) == "REFUSED"
        out, err = proc.communicate("\n", timeout=60)
    assert proc.returncode == 0, err
    # The program's own child is served, after the refusal, by a server still running.
    assert "child FORKED" in out, (out, err)
    assert "alive True" in out, (out, err)
