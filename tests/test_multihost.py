"""Two JAX processes on this machine: sharded loaders, a global batch, one checkpoint.

Runs the script in docs/multihost.md as two processes (CPU, one device each,
gloo collectives). Checks the jitted reduction over the global batch against
the records both shards hold, and that the Orbax checkpoint written by both
processes restores in both.
"""

from __future__ import annotations

import json
import pathlib
import re

import numpy as np
import pytest

import grainlike as grain
from tests.helpers.jax_processes import run_job

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROCESS_TIMEOUT_S = 120


def _script(tmp_path) -> pathlib.Path:
    text = (ROOT / "docs" / "multihost.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    path = tmp_path / "multihost.py"
    path.write_text(block)
    return path


def _expected_sums(num_processes, steps):
    """Sum over all shards' local batches, per step, computed without JAX."""
    iters = []
    for i in range(num_processes):
        shard = grain.ShardOptions(shard_index=i, shard_count=num_processes, drop_remainder=True)
        loader = grain.DataLoader(
            data_source=grain.RangeDataSource(0, 64, 1),
            sampler=grain.IndexSampler(64, shard, shuffle=True, num_epochs=1, seed=0),
            operations=[grain.Batch(batch_size=4, drop_remainder=True)],
            worker_count=0,
        )
        iters.append(iter(loader))
    return [int(sum(np.sum(next(it)) for it in iters)) for _ in range(steps)]


@pytest.mark.timeout(PROCESS_TIMEOUT_S + 30)
def test_two_processes_share_a_global_batch_and_a_checkpoint(tmp_path):
    script = _script(tmp_path)
    ckpt = tmp_path / "ckpt"
    outputs = run_job(script, 2, [ckpt], tmp_path, PROCESS_TIMEOUT_S)

    expected = _expected_sums(2, 5)
    for i, result in enumerate(outputs):
        assert result["process"] == i
        assert result["global_shape"] == [8]  # 4 records from each process
        assert result["sums"] == expected[:3]
        assert result["after"] == expected[3:]
        assert result["restored"] == result["after"]
    files = sorted(p.name for p in (ckpt / "3" / "default").glob("process_*.json"))
    # Each process's state, as grain writes it, and nothing else.
    assert files == ["process_0-of-2.json", "process_1-of-2.json"]
    for i in range(2):
        state = json.loads((ckpt / "3" / "default" / f"process_{i}-of-2.json").read_text())
        assert f"shard_index={i}, shard_count=2" in state["sampler"]
