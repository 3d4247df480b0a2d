"""The worker server grainlike starts when it is imported.

A training script imports grainlike, then initialises JAX (or opens readers,
imports OpenCV): from then on workers cannot fork from the script itself and
start from a server. The server is booted at import, so that the first
iterator finds it ready.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from tests.helpers.leaks import session_processes
from tests.helpers.processes import run_in_session

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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


# Records every module imported after it; preloaded by the worker server after
# grainlike's own preloads (the program's forkserver preloads come last), so in a
# worker it sees what the worker imports after the server forked it.
IMPORT_RECORDER = textwrap.dedent(
    """
    import os
    import sys

    imported = []
    pid = os.getpid()


    class _Recorder:
        def find_spec(self, name, path=None, target=None):
            imported.append(name)
            return None


    sys.meta_path.insert(0, _Recorder())
    """
)

WORKER_IMPORTS = textwrap.dedent(
    """
    import json
    import multiprocessing
    import os
    import sys

    # The server imports its preloads from its working directory, this script's.
    multiprocessing.set_forkserver_preload(["import_recorder"])
    import grainlike as gl
    from grainlike.workers import server as worker_server, start as worker_start

    # Workers start from the server started at import, as after JAX or OpenCV.
    worker_start.fork_is_safe = lambda: False


    class Imported(gl.MapTransform):
        def map(self, x):
            import import_recorder

            if import_recorder.pid == os.getpid():
                return "recorder-imported-in-the-worker"  # It sees nothing then.
            return " ".join(sorted(m for m in import_recorder.imported if m.split(".")[0] in ("grainlike", "numpy")))


    if {pipeline!r} == "DataLoader":
        pipeline = gl.DataLoader(
            data_source=gl.RangeDataSource(0, 8, 1),
            sampler=gl.IndexSampler(8, gl.NoSharding(), shuffle=True, num_epochs=1, seed=3),
            operations=[Imported(), gl.Batch(2)],
            worker_count=2,
        )
    else:
        pipeline = (
            gl.MapDataset.range(8).shuffle(seed=3).map(Imported()).batch(2)
            .to_iter_dataset().mp_prefetch(gl.MultiprocessingOptions(num_workers=2))
        )
    # Each record's map sees what its worker imported until then (its first
    # batches made and sent included, for the later records).
    seen = sorted({{m for batch in pipeline for names in batch for m in str(names).split()}})
    print("RESULT", json.dumps(seen))
    """
)


@pytest.mark.parametrize("pipeline", ["DataLoader", "mp_prefetch"])
def test_workers_from_the_server_import_no_grainlike_or_numpy_module_before_their_first_output(tmp_path, pipeline):
    # What a worker imports after the server forked it, each worker pays before
    # its first batch; the server preloads it instead, once, while the program sets up.
    (tmp_path / "import_recorder.py").write_text(IMPORT_RECORDER)
    (tmp_path / "script.py").write_text(WORKER_IMPORTS.format(pipeline=pipeline))
    # This checkout's grainlike, from a working directory outside it.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    proc, out, err = run_in_session([sys.executable, "script.py"], timeout=120, cwd=str(tmp_path), env=env)
    assert proc.returncode == 0, err
    assert _result(out) == []


IMPORT_IS_LEAN = textwrap.dedent(
    """
    import json, sys
    import grainlike

    loaded = sorted(m for m in sys.modules if m.startswith("grainlike"))
    names = dir(grainlike)
    print("RESULT", json.dumps([loaded, "DataLoader" in names, "MapDataset" in names, grainlike.DataLoader.__name__]))
    """
)


def test_import_grainlike_loads_only_the_worker_server_and_every_name_on_first_use():
    proc, out, err = run_in_session([sys.executable, "-c", IMPORT_IS_LEAN], timeout=60)
    assert proc.returncode == 0, err
    loaded, has_loader, has_dataset, loader_name = _result(out)
    # grainlike.loader's __init__ is a docstring: the package is loaded to make
    # ``grainlike.loader(source)`` callable; none of its modules is.
    assert loaded == [
        "grainlike",
        "grainlike.core",
        "grainlike.core.lazy",
        "grainlike.loader",
        "grainlike.workers",
        "grainlike.workers.server",
    ]
    assert has_loader and has_dataset and loader_name == "DataLoader"
