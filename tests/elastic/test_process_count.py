"""A DataLoader checkpoint of N JAX processes restores in a job of M processes.

Real JAX processes on the CPU (one device each, gloo), started by the test and
ended by it (by pid) if they outlive the timeout. Every record of the two epochs
is delivered once over the checkpointed job and the restored one.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = pathlib.Path(__file__).with_name("host_job.py")
RECORDS, EPOCHS = 24, 2
TIMEOUT_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job(tmp_path, ckpt, n, mode, steps=0, workers=0) -> list[int]:
    """Runs an n-process job; returns the records all its processes delivered."""
    address = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ)
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=1",
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
    )
    tag = f"{mode}{n}_{ckpt.name}"
    logs = [(tmp_path / f"{tag}_out{i}.txt", tmp_path / f"{tag}_err{i}.txt") for i in range(n)]
    ckpt.mkdir(exist_ok=True)  # Orbax makes the item's directory before save().
    args = [str(ckpt), mode, str(steps), str(workers)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), str(i), str(n), address, *args],
            stdout=open(logs[i][0], "w"), stderr=open(logs[i][1], "w"), env=env, cwd=tmp_path,
        )
        for i in range(n)
    ]
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break  # the others would wait for it in jax.distributed
            time.sleep(0.05)
    finally:
        for p in procs:  # only the processes this test started
            if p.poll() is None:
                p.kill()
            p.wait()
    for p, (out, err) in zip(procs, logs):
        assert p.returncode == 0, f"process exited with {p.returncode}:\n{err.read_text()[-4000:]}"
    records = []
    for i, (out, _) in enumerate(logs):
        result = json.loads(out.read_text().strip().splitlines()[-1])
        assert result["process"] == i
        records += result["delivered"]
    return records


def _assert_every_record_once(before: list, after: list) -> None:
    got = collections.Counter(before) + collections.Counter(after)
    expected = collections.Counter(list(range(RECORDS)) * EPOCHS)
    assert got == expected, (
        f"twice: {sorted((got - expected).elements())}, never: {sorted((expected - got).elements())}"
    )


@pytest.mark.timeout(4 * TIMEOUT_S)
def test_checkpoint_of_two_processes_restores_on_one_and_on_three(tmp_path, no_leaks):
    ckpt = tmp_path / "two"
    # 5 steps of 3 records per process: each shard of 12 records per epoch is in
    # its second epoch.
    before = _job(tmp_path, ckpt, 2, "save", steps=5)
    assert sorted(p.name for p in ckpt.iterdir()) == ["process_0-of-2.json", "process_1-of-2.json"]
    copy = tmp_path / "two_copy"
    shutil.copytree(ckpt, copy)
    _assert_every_record_once(before, _job(tmp_path, ckpt, 1, "restore"))
    _assert_every_record_once(before, _job(tmp_path, copy, 3, "restore", workers=2))


@pytest.mark.timeout(3 * TIMEOUT_S)
def test_checkpoint_of_one_process_restores_on_two(tmp_path, no_leaks):
    ckpt = tmp_path / "one"
    before = _job(tmp_path, ckpt, 1, "save", steps=3)
    assert sorted(p.name for p in ckpt.iterdir()) == ["process_0-of-1.json"]
    _assert_every_record_once(before, _job(tmp_path, ckpt, 2, "restore"))
