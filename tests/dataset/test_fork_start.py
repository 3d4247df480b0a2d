"""Workers fork from the calling process when that is safe, else from the preloaded server.

Safe: no other Python thread and no JAX backend in the calling process. Either
way the outputs and states are the same.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from tests.helpers.processes import run_in_session

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, threading
    sys.path.insert(0, {root!r})
    import psutil
    import grainlike as gl
    from grainlike.workers import start as worker_start

    how = {how!r}
    if how == "thread":
        stop = threading.Event()
        threading.Thread(target=stop.wait, daemon=True).start()
    elif how == "jax":
        import jax.numpy as jnp
        jnp.zeros(1).block_until_ready()  # starts the CPU backend
    elif how == "server":
        worker_start.fork_is_safe = lambda: False
    elif how == "array_record":
        # An open reader's thread pool: a child forked with it copied crashes
        # on its first read.
        from array_record.python.array_record_module import ArrayRecordWriter
        path = os.path.join({tmp!r}, "data.array_record")
        writer = ArrayRecordWriter(path, "group_size:1")
        for i in range(30):
            writer.write(str(i).encode())
        writer.close()
        reader = gl.ArrayRecordDataSource(path)
        assert reader[0] == b"0"

    class Square(gl.MapTransform):
        def map(self, x):
            if how == "array_record":
                # OpenCV in a child forked from a process running the reader's
                # thread pool crashes (SIGSEGV): the W2 pipeline's case.
                import cv2, numpy as np
                cv2.resize(np.zeros((96, 96, 3), np.uint8), (64, 64))
            x = int(x)  # ArrayRecord records are bytes
            return x * x

    loader = gl.DataLoader(
        data_source=reader if how == "array_record" else gl.RangeDataSource(0, 30, 1),
        sampler=gl.IndexSampler(30, gl.NoSharding(), shuffle=True, num_epochs=1, seed=3),
        operations=[Square(), gl.Batch(4)],
        worker_count=2,
    )
    safe = worker_start.fork_is_safe()
    it = iter(loader)
    out = [next(it).tolist()]
    parents = sorted({{psutil.Process(p.pid).ppid() == os.getpid() for p in it._stream._shutdown.procs}})
    states = [it.get_state().decode()]
    for b in it:
        out.append(b.tolist())
        states.append(it.get_state().decode())
    if how == "thread":
        stop.set()
    print("RESULT", json.dumps({{"safe": safe, "forked_here": parents, "out": out, "states": states}}))
    """
)


def _run(how: str, tmp: str = "") -> dict:
    root = __file__.rsplit("/tests/", 1)[0]
    proc, out, err = run_in_session(
        [sys.executable, "-c", SCRIPT.format(root=root, how=how, tmp=tmp)], timeout=120,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, err
    return json.loads([l for l in out.splitlines() if l.startswith("RESULT")][-1][len("RESULT "):])


@pytest.fixture(scope="module")
def from_server() -> dict:
    return _run("server")


def test_a_single_threaded_process_forks_its_workers_itself(from_server):
    forked = _run("plain")
    assert forked["safe"] is True
    assert forked["forked_here"] == [True]
    assert from_server["forked_here"] == [False]
    assert forked["out"] == from_server["out"] and forked["states"] == from_server["states"]
    assert len(forked["out"]) == 8


@pytest.mark.parametrize("how", ["thread", "jax", "array_record"])
def test_a_thread_or_a_jax_backend_sends_the_fork_to_the_server(how, from_server, tmp_path):
    pytest.importorskip({"jax": "jax", "array_record": "cv2"}.get(how, "json"))
    got = _run(how, str(tmp_path))
    assert got["safe"] is False
    assert got["forked_here"] == [False]
    assert got["out"] == from_server["out"]
    assert _positions(got["states"]) == _positions(from_server["states"])


def _positions(states: list) -> list:
    """The states without the source's name (the array_record case reads another source)."""
    out = []
    for s in states:
        d = json.loads(s)
        d.pop("data_source")
        out.append(d)
    return out
