"""The worker server grainlike starts when it is imported.

A training script imports grainlike, then initialises JAX (or opens readers,
imports OpenCV): from then on workers cannot fork from the script itself and
start from a server. The server is booted at import, so that the first
iterator finds it ready.
"""

from __future__ import annotations

import json
import sys
import textwrap

from tests.helpers.leaks import session_processes
from tests.helpers.processes import run_in_session

# Reports the pids of grainlike's server(s), the process-wide forkserver, the
# parent of each worker, and whether JAX's backend was up when the workers started.
WORKERS_AFTER_JAX = textwrap.dedent(
    """
    import os
    import grainlike as gl
    from multiprocessing import forkserver
    from grainlike.workers import server as worker_server, start as worker_start

    servers_at_import = [s._forkserver_pid for s in worker_server._servers.values()]
    import jax
    import jax.numpy as jnp

    jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()

    class ParentPid(gl.MapTransform):
        def map(self, x):
            return os.getppid()

    loader = gl.DataLoader(
        data_source=gl.RangeDataSource(0, 4, 1),
        sampler=gl.IndexSampler(4, gl.NoSharding(), shuffle=False, num_epochs=1),
        operations=[ParentPid()],
        worker_count=2,
    )
    parents = sorted(set(int(p) for p in loader))
    import json
    print("RESULT", json.dumps([servers_at_import, parents, worker_start.fork_is_safe(), forkserver._forkserver._forkserver_pid]))
    """
)


def _result(out: str):
    line = [l for l in out.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def _run_file(tmp_path, script: str, timeout: float):
    # A file, not ``-c``: multiprocessing's own children import the main module.
    path = tmp_path / "script.py"
    path.write_text(script)
    return run_in_session([sys.executable, str(path)], timeout=timeout)


def test_workers_after_jax_start_from_the_server_started_at_import():
    proc, out, err = run_in_session([sys.executable, "-c", WORKERS_AFTER_JAX], timeout=120)
    assert proc.returncode == 0, err
    servers_at_import, parents, fork_safe, global_server = _result(out)
    assert len(servers_at_import) == 1 and servers_at_import[0] is not None
    # JAX's backend is up, so workers came from the server booted at import,
    # not from a fork of this process nor from a server started at the first iterator.
    assert fork_safe is False
    assert parents == servers_at_import
    # multiprocessing's own forkserver, the program's to use, was not started.
    assert global_server is None


NO_SERVER_IN_CHILDREN = textwrap.dedent(
    """
    import multiprocessing as mp
    import os

    def child(q):
        import grainlike
        from grainlike.workers import server as worker_server, start as worker_start
        q.put(len(worker_server._servers))

    if __name__ == "__main__":
        import grainlike
        from grainlike.workers import server as worker_server, start as worker_start
        q = mp.get_context("spawn").Queue()
        p = mp.get_context("spawn").Process(target=child, args=(q,))
        p.start()
        in_child = q.get(timeout=60)
        p.join(60)
        print("RESULT", [len(worker_server._servers), in_child])
    """
)


def test_processes_multiprocessing_starts_do_not_start_servers_of_their_own(tmp_path):
    proc, out, err = _run_file(tmp_path, NO_SERVER_IN_CHILDREN, timeout=120)
    assert proc.returncode == 0, err
    assert _result(out) == [1, 0]


SERVER_ENDS_WITH_PROCESS = textwrap.dedent(
    """
    import os, sys
    import grainlike
    from grainlike.workers import server as worker_server, start as worker_start

    print("RESULT", os.getsid(0), flush=True)
    """
)


def test_the_server_ends_with_the_process_that_imported_grainlike():
    proc, out, err = run_in_session([sys.executable, "-c", SERVER_ENDS_WITH_PROCESS], timeout=60)
    assert proc.returncode == 0, err
    line = [l for l in out.splitlines() if l.startswith("RESULT ")][-1]
    sid = int(line.split()[1])
    from tests.helpers.leaks import wait_until

    # The server (and the resource tracker) see the importer's pipes close and exit.
    assert wait_until(lambda: not session_processes(sid), timeout=10), session_processes(sid)


USER_FORKSERVER_PRELOAD = textwrap.dedent(
    """
    import json
    import multiprocessing as mp
    import sys

    def probe(q):
        q.put(["colorsys" in sys.modules, "grainlike.workers.main" in sys.modules])

    if __name__ == "__main__":
        import grainlike
        ctx = mp.get_context("forkserver")
        # The program's own forkserver preloads take effect after importing grainlike.
        ctx.set_forkserver_preload(["colorsys"])
        q = ctx.Queue()
        p = ctx.Process(target=probe, args=(q,))
        p.start()
        got = q.get(timeout=60)
        p.join(60)
        print("RESULT", json.dumps(got))
    """
)


def test_the_programs_own_forkserver_is_left_to_it(tmp_path):
    proc, out, err = _run_file(tmp_path, USER_FORKSERVER_PRELOAD, timeout=120)
    assert proc.returncode == 0, err
    # Its server preloads what the program asked for, and not grainlike's worker loop.
    assert _result(out) == [True, False]
