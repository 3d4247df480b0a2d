"""SIGKILL a training run at random moments; over all restarts every record is trained on once.

``kill_anywhere_train.py`` (2 DataLoader workers, batches put on the device
ahead by a ``DeviceIterator``, an asynchronous Orbax CheckpointManager saving
model and iterator every 4 steps, every delivered record id logged and fsynced) is started, killed with SIGKILL at a seeded
random moment, and started again, ``KILLS`` times; then it runs to the end of
the epoch. The moments cycle through: while Python imports / the workers start
(a delay from the process start), just after a restore while the workers start,
just after ``save()`` returned (its files still being written), and between saves.
Each restart restores the latest complete checkpoint and checks the model
against the log trimmed to it. At the end the log, trimmed at every restore,
must hold every record of the epoch exactly once, in the order of a run never
killed, and no process of any killed run may remain.

The same test runs with the worker count changing at every restart (2, 1, 3,
...; without the DeviceIterator, to save time), restoring checkpoints on another
number of workers: every record exactly once, in an order that depends on the
worker counts.

The default run kills 6 times in each, every kind of moment at least once (one
Python start with jax and orbax costs ~1.5-3 s here, and each test takes ~15-25 s
on 2 busy cores); ``GRAINLIKE_KILL_ANYWHERE_KILLS=20`` kills 20 times (~45-60 s each).
"""

from __future__ import annotations

import os
import pathlib
import queue
import random
import signal
import sys
import threading
import time

import pytest

import grainlike
from tests.checkpoint import kill_anywhere_train as train
from tests.helpers.leaks import session_processes, shm_entries, wait_until
from tests.helpers.processes import in_session

KILLS = int(os.environ.get("GRAINLIKE_KILL_ANYWHERE_KILLS", "6"))
SEED = 20261124
RUN_TIMEOUT_S = 60
SCRIPT = pathlib.Path(train.__file__)
ROOT = SCRIPT.resolve().parents[2]
KINDS = ("starting", "restored", "saving", "between saves")


def _env():
    env = dict(os.environ)
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _lines(stream) -> "queue.Queue[str | None]":
    """The stream's lines as they come; None when it ends."""
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in stream:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


class Run:
    """One start of the script, read marker by marker."""

    def __init__(self, proc):
        self.proc = proc
        self.markers = _lines(proc.stdout)
        self.stderr = []
        threading.Thread(target=lambda: self.stderr.extend(proc.stderr), daemon=True).start()
        self.seen: list[str] = []
        self.deadline = time.monotonic() + RUN_TIMEOUT_S

    def wait_for(self, predicate, until: float | None = None) -> bool | None:
        """Reads markers until one satisfies ``predicate`` (True), the run ends (False)
        or the ``time.monotonic()`` ``until`` comes (None)."""
        while True:
            deadline = self.deadline if until is None else min(until, self.deadline)
            try:
                line = self.markers.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                if until is not None and time.monotonic() >= until:
                    return None
                raise AssertionError(f"no marker in {RUN_TIMEOUT_S} s; last: {self.seen[-3:]}") from None
            if line is None:
                return False
            self.seen.append(line)
            if predicate(line):
                return True

    def failure(self, what: str) -> str:
        time.sleep(0.2)  # lets the stderr reader catch up
        return f"{what} (exit {self.proc.returncode}); markers {self.seen[-5:]}; stderr:\n{''.join(self.stderr)[-3000:]}"


def _nth(kind: str, n: int):
    """A predicate true at the ``n``-th marker of ``kind``."""
    count = [0]

    def predicate(line: str) -> bool:
        word, _, arg = line.partition(" ")
        hit = (
            (kind == "restored" and word == "started")
            or (kind == "saving" and word == "saved")
            or (kind == "between saves" and word == "step" and int(arg) % train.SAVE_EVERY == 1)
        )
        count[0] += hit
        return count[0] == n

    return predicate


def _kill_at(run: Run, kind: str, rng: random.Random) -> None:
    """Sends SIGKILL to the script (its workers are left to notice) at a moment of ``kind``."""
    # The delays are short once training runs: all the killed runs together
    # must not reach the end of the epoch.
    if kind == "starting":
        # Anywhere in the start: imports, the manager, the restore, the workers.
        until = time.monotonic() + rng.uniform(0.05, 3.0)
        started = run.wait_for(_nth("restored", 1), until=until)
        assert started is not False, run.failure("ended while starting")
        if started:
            time.sleep(rng.uniform(0.0, 0.05))
    else:
        n = 1 if kind == "restored" else rng.randint(1, 2)
        assert run.wait_for(_nth(kind, n)), run.failure(f"ended before the {n}th {kind!r} marker")
        time.sleep(rng.uniform(0.0, 0.1 if kind == "restored" else 0.02))
    assert run.proc.poll() is None, run.failure(f"exited before the kill ({kind})")
    run.proc.send_signal(signal.SIGKILL)
    run.proc.wait(timeout=10)


def _reference_order(worker_count: int) -> list[int]:
    with iter(train.loader(grainlike, worker_count)) as it:
        return [int(i) for batch in it for i in batch]


def _cmd(tmp_path, worker_count: int, device: bool) -> list[str]:
    cmd = [sys.executable, str(SCRIPT), str(tmp_path), "--workers", str(worker_count)]
    return cmd + ["--device"] if device else cmd


@pytest.mark.timeout(RUN_TIMEOUT_S + KILLS * 15)
@pytest.mark.parametrize(
    "worker_counts,device",
    # Elastic: the worker count cycles 2, 1, 3 from run to run, so most restores
    # are onto another worker count than the checkpoint's.
    [((2,), True), ((2, 1, 3), False)],
    ids=["same_workers_device_iterator", "elastic"],
)
def test_killed_anywhere_every_record_is_trained_on_exactly_once(tmp_path, worker_counts, device):
    rng = random.Random(SEED)
    sessions, kinds = [], []
    for k in range(KILLS):
        kind = KINDS[k % len(KINDS)]  # every kind, the moment within it random
        cmd = _cmd(tmp_path, worker_counts[k % len(worker_counts)], device)
        with in_session(cmd, env=_env(), cwd=tmp_path) as proc:
            sessions.append(proc.pid)
            run = Run(proc)
            _kill_at(run, kind, rng)
            assert proc.returncode == -signal.SIGKILL, run.failure(f"kill {k} ({kind}) found it ended")
            kinds.append((kind, run.seen[-1] if run.seen else "-"))

    with in_session(_cmd(tmp_path, worker_counts[0], device), env=_env(), cwd=tmp_path) as proc:
        sessions.append(proc.pid)
        run = Run(proc)
        assert run.wait_for(lambda line: line == "done"), run.failure("the last run did not finish")
        assert proc.wait(timeout=RUN_TIMEOUT_S) == 0, run.failure("the last run failed")

    # The log, trimmed to the checkpoint at every restore: every record once, in order.
    log = train.read_log(str(tmp_path / "log"), last_step=10**9)
    ids = [i for _, i in log]
    if len(worker_counts) == 1:
        assert ids == _reference_order(worker_counts[0]), kinds
    else:
        # Each worker batches its own records, so the order depends on the worker
        # count of each run; the records do not.
        assert sorted(ids) == list(range(train.NUM_RECORDS)), kinds
    steps = [s for s, _ in log]
    assert steps == sorted(steps) and set(steps) == set(range(1, steps[-1] + 1))

    # Workers of killed runs notice their parent is gone and exit; nothing in /dev/shm.
    assert wait_until(lambda: not any(session_processes(s) for s in sessions), timeout=15), (
        f"processes of killed runs left: {[(s, session_processes(s)) for s in sessions if session_processes(s)]}"
    )
    left = {n for pid in sessions for n in shm_entries(f"grainlike_{pid}_") | shm_entries(f"grainlike_src_{pid}_")}
    assert not left, f"shared memory left by killed runs: {sorted(left)}"
