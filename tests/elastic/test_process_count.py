"""A DataLoader checkpoint of N JAX processes restores in a job of M processes.

Real JAX processes on the CPU (one device each, gloo), started by the test and
ended by it (by pid) if they outlive the timeout. Every record of the two epochs
is delivered once over the checkpointed job and the restored one.
"""

from __future__ import annotations

import collections
import pathlib
import shutil

import pytest

from tests.helpers.jax_processes import run_job

SCRIPT = pathlib.Path(__file__).with_name("host_job.py")
RECORDS, EPOCHS = 24, 2
TIMEOUT_S = 90


def _job(tmp_path, ckpt, n, mode, steps=0, workers=0) -> list[int]:
    """Runs an n-process job; returns the records all its processes delivered.

    After a restore every process delivers as many records as the others (the
    ``drop_remainder=True`` sharding drops the extra ones of the epoch under way).
    """
    ckpt.mkdir(exist_ok=True)  # Orbax makes the item's directory before save().
    results = run_job(SCRIPT, n, [ckpt, mode, steps, workers], tmp_path, TIMEOUT_S)
    assert [r["process"] for r in results] == list(range(n))
    assert len({len(r["delivered"]) for r in results}) == 1, [len(r["delivered"]) for r in results]
    return [v for r in results for v in r["delivered"]]


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
    # Each process's state, as grain writes it, and nothing else.
    assert sorted(p.name for p in ckpt.iterdir()) == ["process_0-of-2.json", "process_1-of-2.json"]
    copy = tmp_path / "two_copy"
    shutil.copytree(ckpt, copy)
    _assert_every_record_once(before, _job(tmp_path, ckpt, 1, "restore"))
    # On 3: equal shares, so a few records of the epoch under way are dropped.
    after = _job(tmp_path, copy, 3, "restore", workers=2)
    got = collections.Counter(before) + collections.Counter(after)
    expected = collections.Counter(list(range(RECORDS)) * EPOCHS)
    assert not got - expected, "a record came twice"
    assert 0 < sum((expected - got).values()) <= 3 * 2 * 3  # processes x workers x batch


@pytest.mark.timeout(3 * TIMEOUT_S)
def test_checkpoint_of_one_process_restores_on_two(tmp_path, no_leaks):
    ckpt = tmp_path / "one"
    before = _job(tmp_path, ckpt, 1, "save", steps=3)
    assert sorted(p.name for p in ckpt.iterdir()) == ["process_0-of-1.json"]
    _assert_every_record_once(before, _job(tmp_path, ckpt, 2, "restore"))
