"""Stall detection times workers by the consumer's clock, and only while the consumer runs.

A job suspended as a whole (SIGSTOP of its process group, Ctrl-Z, a debugger,
the machine asleep) for longer than ``stall_timeout_s`` is not a stalled
worker: once resumed it goes on. Before, the consumer compared its clock with
the last progress time a worker wrote, so the first look after SIGCONT raised
``WorkerStalledError`` at once; and a worker's transform that moved the
worker's clock forward and then hung was never reported.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from grainlike.core.errors import WorkerStalledError
from grainlike.dataset import MapDataset
from grainlike.dataset.nodes.options import MultiprocessingOptions
from tests.helpers import leaks
from tests.helpers.processes import in_session
from tests.reliability.user_code import ClockForwardThenHang

pytestmark = pytest.mark.timeout(180)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The job: 24 elements of 0.4 s each on 2 workers, a stall timeout of 1 s.
_JOB = r"""
import json, sys
import grainlike as grain
from grainlike.dataset import MapDataset
from tests.reliability.user_code import Sleep

N = 24
if sys.argv[1] == "loader":
    it = iter(grain.DataLoader(
        data_source=grain.RangeDataSource(0, N, 1),
        sampler=grain.IndexSampler(N, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
        operations=[Sleep(0.4)], worker_count=2, stall_timeout_s=1.0,
    ))
else:
    ds = MapDataset.range(N).map(Sleep(0.4)).to_iter_dataset()
    it = iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2, stall_timeout_s=1.0)))
got = [int(next(it))]
print("ready", flush=True)
got += [int(x) for x in it]
print("RESULT", json.dumps(got), flush=True)
"""


@pytest.mark.parametrize("face", ["mp_prefetch", "loader"])
def test_a_job_stopped_longer_than_the_stall_timeout_goes_on_when_resumed(face):
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    with in_session([sys.executable, "-c", _JOB, face], env=env, cwd=ROOT) as proc:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.6)  # The consumer now waits for a worker in the middle of an element.
        os.killpg(proc.pid, signal.SIGSTOP)  # The whole job: consumer, workers, worker server.
        time.sleep(4.0)  # Four stall timeouts.
        os.killpg(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        assert "WorkerStalledError" not in err
        line = [line for line in out.splitlines() if line.startswith("RESULT ")][-1]
        assert json.loads(line[len("RESULT "):]) == list(range(24))
        assert leaks.wait_until(lambda: not leaks.session_processes(proc.pid), timeout=15)


def test_a_worker_that_moves_its_clock_forward_and_hangs_is_still_reported(no_leaks):
    # Element 7 is worker 1's (2 workers take elements 1, 3, 5, 7, ...), the first
    # of a read chunk: its transform sets the worker's clock a day ahead, is busy
    # for a second (the worker is seen moving), then hangs.
    ds = MapDataset.range(16).map(ClockForwardThenHang(7)).to_iter_dataset()
    it = iter(ds.mp_prefetch(MultiprocessingOptions(num_workers=2, stall_timeout_s=1.0)))
    got = []
    start = time.monotonic()
    try:
        with pytest.raises(WorkerStalledError) as info:
            for x in it:
                got.append(x)
        assert time.monotonic() - start < 60  # About 3 s unloaded: 1 s busy, then the 1 s timeout.
        message = str(info.value)
        assert "worker 1 of 2 (pid " in message
        # The element: after the worker's last delivered one (its elements 1, 3, 5),
        # and the stuck transform, from the worker's stack.
        assert "its state after its last delivered output: {'next_index': 3}" in message
        assert "user_code.py" in message and "in map" in message
        assert got == [0, 1, 2, 3, 4, 5, 6]
    finally:
        it.close()
