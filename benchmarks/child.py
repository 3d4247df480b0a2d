"""One measurement in a fresh Python process: ``python -m <module> --child ARGS...``.

The bench modules with their own workload (``bench.SECTIONS``) measure each
configuration in a new process, so that imports, caches and memory of one
configuration do not reach the next; the child prints its result as one JSON
line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_child(module: str, args: list[str], timeout: float = 300) -> dict:
    """Runs ``python -m module --child *args`` in its own session; returns its last JSON line.

    The child runs JAX on the CPU with the repository on its path. On a timeout
    its whole process group (workers included) is killed.

    Returns:
      The parsed last stdout line starting with ``{``, or ``{"error": ...}`` with
      the last line of its stderr if it failed or printed none.
    """
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--child", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = "", f"timed out after {timeout:g} s"
    finally:
        if proc.poll() is None:  # only the group this function started
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (err.strip().splitlines() or ["failed"])[-1][:200]}
    return json.loads(lines[-1])
