"""In a Jupyter kernel, workers fork from the kernel as torch's do: its own threads hold nothing a worker needs.

The kernel runs threads of its own (socket pollers, heartbeat, history writer,
output watchers); a thread of the user's, or JAX's backend, still sends the
workers to the worker server.
"""

from __future__ import annotations

import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SETUP = """
import json, os, threading, time
import grainlike as gl
from grainlike.workers import start as worker_start

class Where(gl.MapTransform):
    def map(self, x):
        print(f"from a worker {x}")
        return os.getppid()

def parents():
    loader = gl.DataLoader(
        data_source=gl.RangeDataSource(0, 8, 1),
        sampler=gl.IndexSampler(8, gl.NoSharding(), shuffle=False, num_epochs=1),
        operations=[Where()],
        worker_count=2,
    )
    return sorted(set(int(p) for p in loader))
"""


@pytest.fixture(scope="module")
def kernel():
    pytest.importorskip("ipykernel", reason="ipykernel is in the dev extra")
    from jupyter_client.manager import start_new_kernel

    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _run(kc, code: str) -> tuple[str, list]:
    """Runs a cell; returns (stdout text, RESULT values printed)."""
    out: list = []

    def hook(msg):
        if msg["header"]["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, timeout=120, output_hook=hook)
    assert reply["content"]["status"] == "ok", reply["content"].get("traceback")
    text = "".join(out)
    results = [json.loads(l[len("RESULT "):]) for l in text.splitlines() if l.startswith("RESULT ")]
    return text, results


def test_workers_fork_from_a_jupyter_kernel_and_their_output_reaches_it(kernel):
    _run(kernel, SETUP)
    text, [[safe, kernel_pid, parents]] = _run(
        kernel, "print('RESULT', json.dumps([worker_start.fork_is_safe(), os.getpid(), parents()]))"
    )
    assert safe is True
    assert parents == [kernel_pid]
    # What a transform prints in a worker shows in the notebook.
    assert "from a worker 0" in text and "from a worker 7" in text


def test_a_thread_of_the_users_sends_workers_to_the_server(kernel):
    _run(kernel, SETUP)
    _, [[safe, kernel_pid, parents]] = _run(
        kernel,
        "stop = threading.Event(); t = threading.Thread(target=stop.wait); t.start()\n"
        "try:\n"
        "    print('RESULT', json.dumps([worker_start.fork_is_safe(), os.getpid(), parents()]))\n"
        "finally:\n"
        "    stop.set(); t.join()",
    )
    assert safe is False
    assert parents != [kernel_pid] and len(parents) == 1
