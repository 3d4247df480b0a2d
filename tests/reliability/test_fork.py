"""Fork in the user's process: a child neither uses nor stops its parent's workers.

Each case runs a script in its own session (so that the test ends exactly the
processes it started): the parent iterates with workers, forks (``os.fork()`` or
a ``multiprocessing`` Process with the fork start method), and the child tries
the parent's iterator, builds loaders of its own with workers, and exits
normally. The parent then finishes its epoch.
"""

import os
import sys
import textwrap

import pytest

from tests.helpers import leaks
from tests.helpers.processes import run_in_session

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SCRIPT = """
import multiprocessing, os, sys
sys.path.insert(0, {root!r})
import grainlike as grain
from grainlike.dataset.base import MapDataset
from grainlike.dataset.nodes.options import MultiprocessingOptions
from grainlike.core.errors import ForeignWorkersError

face, how = sys.argv[1], sys.argv[2]

def make():
    if face == "loader":
        return grain.DataLoader(
            data_source=list(range(24)),
            sampler=grain.IndexSampler(24, grain.NoSharding(), shuffle=True, num_epochs=1, seed=3),
            operations=[grain.Batch(2)], worker_count=2)
    ds = MapDataset.range(24).shuffle(seed=3).to_iter_dataset().batch(2)
    return ds.mp_prefetch(MultiprocessingOptions(num_workers=2))

def epoch(iterable):
    it = iter(iterable)
    try:
        return [b.tolist() for b in it]
    finally:
        it.close()

expected = epoch(make())
it = iter(make())
got = [next(it).tolist() for _ in range(3)]

def child():
    print("child pid", os.getpid(), flush=True)
    try:
        next(it)
        print("child used the parent's iterator", flush=True)
    except ForeignWorkersError as e:
        print("child foreign", e, flush=True)
    print("child own", epoch(make()) == expected, flush=True)

if how == "os.fork":
    pid = os.fork()
    if pid == 0:
        child()
        sys.exit(0)  # a normal exit: atexit handlers and finalizers run
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
else:
    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    proc.join()
    code = proc.exitcode
print("child exit", code, flush=True)
got += [b.tolist() for b in it]
print("parent same", got == expected, flush=True)
it.close()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["os.fork", "process"])
@pytest.mark.parametrize("face", ["loader", "dataset"])
def test_a_forked_child_neither_uses_nor_stops_the_parents_workers(no_leaks, tmp_path, face, how):
    script = tmp_path / "fork_script.py"
    script.write_text(textwrap.dedent(_SCRIPT.format(root=ROOT)))
    proc, out, err = run_in_session(
        [sys.executable, str(script), face, how], timeout=45, cwd=str(tmp_path)
    )
    lines = out.splitlines()
    assert proc.returncode == 0, err
    child_pid = next(int(line.split()[-1]) for line in lines if line.startswith("child pid"))
    foreign = [line for line in lines if line.startswith("child foreign")]
    assert foreign and "ForeignWorkersError" not in foreign[0], out
    assert f"is a fork of it" in foreign[0] and "create a new iterator" in foreign[0]
    assert "child own True" in lines, out + err
    assert "child exit 0" in lines, out + err
    assert "parent same True" in lines, out + err  # no batch skipped, workers not stopped
    assert "WorkerDiedError" not in err and "Traceback" not in err, err
    assert leaks.wait_until(lambda: not leaks.session_processes(proc.pid)), "processes left behind"
    for pid in (proc.pid, child_pid):
        assert not leaks.shm_entries(f"grainlike_{pid}_")
