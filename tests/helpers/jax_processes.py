"""Runs a script as the processes of one multi-process JAX job on the CPU.

One device per process, collectives over gloo (the script sets that up); the
processes are started by the caller's test and, if they outlive the timeout or
one of them fails (the others would wait for it in a barrier), killed by pid.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Sequence

from tests.helpers.server_process import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_job(script: pathlib.Path, num_processes: int, args: Sequence[str], workdir: pathlib.Path, timeout_s: float) -> list:
    """Runs ``script PROCESS_ID NUM_PROCESSES COORDINATOR *args`` once per process.

    Returns:
      The JSON object each process printed last on stdout, by process index.

    Raises:
      AssertionError: a process exited with an error (its stderr's end is shown).
    """
    address = f"127.0.0.1:{free_port()}"
    env = dict(os.environ)
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=1",
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
    )
    tag = f"{script.stem}_{time.monotonic_ns()}"
    logs = [(workdir / f"{tag}_out{i}.txt", workdir / f"{tag}_err{i}.txt") for i in range(num_processes)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(i), str(num_processes), address, *map(str, args)],
            stdout=open(logs[i][0], "w"), stderr=open(logs[i][1], "w"), env=env, cwd=workdir,
        )
        for i in range(num_processes)
    ]
    try:
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.05)
    finally:
        for p in procs:  # only the processes started here
            if p.poll() is None:
                p.kill()
            p.wait()
    for p, (out, err) in zip(procs, logs):
        assert p.returncode == 0, f"process exited with {p.returncode}:\n{err.read_text()[-4000:]}"
    return [json.loads(out.read_text().strip().splitlines()[-1]) for out, _ in logs]
