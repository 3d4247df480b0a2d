"""SIGKILL a training run, restart it, and get exactly the uninterrupted run.

The training script is the last code block of docs/checkpointing.md: a JAX linear
model fed by a grainlike loader (through a prefetching DeviceIterator) and
checkpointed by an Orbax CheckpointManager every 4 steps. It logs the ids of
every batch it trains on. Here it is killed while running (after step 10, so
steps 9-10 are lost with it), started again, and must: resume from the last
complete checkpoint, train on the same batches in the same order as a run that
never stopped, and end with bit-identical parameters.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
STEPS = 16
HANG_AT = 10
PROCESS_TIMEOUT_S = 90


def _script(tmp_path) -> pathlib.Path:
    text = (ROOT / "docs" / "checkpointing.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text, flags=re.S)[-1]
    assert "def train(" in block
    path = tmp_path / "train.py"
    path.write_text(block)
    return path


def _env():
    env = dict(os.environ)
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=1",
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
    )
    return env


def _read_log(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _wait_for_step(proc, log, step, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["step"] == step for r in _read_log(log)):
            return
        if proc.poll() is not None:
            raise AssertionError(f"training exited with {proc.returncode} before step {step}")
        time.sleep(0.05)
    raise AssertionError(f"training did not reach step {step} in {timeout} s")


def _run(cmd, tmp_path, name):
    err = tmp_path / f"{name}.err"
    with open(err, "w") as f:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True, env=_env(),
                              cwd=tmp_path, timeout=PROCESS_TIMEOUT_S)
    assert proc.returncode == 0, err.read_text()[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(3 * PROCESS_TIMEOUT_S)
@pytest.mark.parametrize("worker_count", [0, 2])
def test_killed_training_resumes_exactly(tmp_path, worker_count):
    script = _script(tmp_path)
    base = [sys.executable, str(script), "--steps", str(STEPS), "--workers", str(worker_count)]

    # The reference: one uninterrupted run of the same code, in this process
    # (saves starting another JAX process).
    ref_log = tmp_path / "reference.jsonl"
    namespace = {"__name__": "train_reference"}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    ref_params = namespace["train"](str(tmp_path / "ref_ckpt"), STEPS, worker_count, str(ref_log))
    ref_params = json.loads(json.dumps(ref_params))  # as the script prints them
    reference = _read_log(ref_log)
    assert [r["step"] for r in reference] == list(range(1, STEPS + 1))

    # Run 1: killed with SIGKILL, no chance to clean up, while it is running.
    ckpt, log = tmp_path / "ckpt", tmp_path / "run.jsonl"
    with open(tmp_path / "killed.err", "w") as err:
        proc = subprocess.Popen(
            base + [str(ckpt), "--log", str(log), "--hang-at", str(HANG_AT)],
            stdout=subprocess.DEVNULL, stderr=err, env=_env(), cwd=tmp_path,
        )
    workers = []
    try:
        _wait_for_step(proc, log, HANG_AT, PROCESS_TIMEOUT_S)
        workers = psutil.Process(proc.pid).children(recursive=True)  # (Kept as processes: one may end any time.)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:  # only the process this test started
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    run1 = _read_log(log)
    assert run1 == reference[:HANG_AT]

    # Its worker processes notice the parent is gone and exit by themselves.
    _, alive = psutil.wait_procs(workers, timeout=10)
    for p in alive:  # left behind: clean up the ones this test caused, then fail
        p.kill()
    assert not alive, f"worker processes outlived the killed run: {[p.pid for p in alive]}"
    leftover = [n for n in os.listdir("/dev/shm") if n.startswith(f"grainlike_{proc.pid}_")]
    assert not leftover, f"shared memory left by the killed run: {leftover}"

    # Run 2: the same command; it restores the last complete checkpoint.
    steps_on_disk = sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())
    assert steps_on_disk and max(steps_on_disk) <= HANG_AT
    log.write_text("")
    params = _run(base + [str(ckpt), "--log", str(log)], tmp_path, "resumed")
    run2 = _read_log(log)
    resumed_from = run2[0]["step"] - 1
    assert resumed_from == max(steps_on_disk) and resumed_from % 4 == 0
    # Steps after the last checkpoint are trained on again, on the same batches;
    # together the two runs saw exactly the uninterrupted sequence.
    assert run1[:resumed_from] + run2 == reference
    assert params == ref_params
