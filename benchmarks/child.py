"""One measurement in a fresh Python process: ``python -m <module> --child ARGS...``.

The bench modules measure each configuration in a new process, so that
imports, caches and memory of one configuration do not reach the next; the
child prints its result as one JSON line. Their reports summarise the runs of
each configuration by medians.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_child(
    module: str, args: list, timeout: float = 300, env: dict | None = None, peak_rss: bool = False
) -> dict:
    """Runs ``python -m module --child *args`` in its own session; returns its last JSON line.

    The child runs JAX on the CPU (or on ``GRAINLIKE_BENCH_JAX_PLATFORMS``) with the
    repository on its path. On a timeout
    its whole process group (workers included) is killed.

    Args:
      module: the module to run, e.g. ``"benchmarks.packing"``.
      args: the arguments after ``--child`` (each passed through ``str``).
      timeout: seconds before the child's process group is killed.
      env: variables to set in the child besides the current environment.
      peak_rss: also sample the resident memory of the child and all its
        descendants every 50 ms; the peak, in MB, is added as ``"peak_mb"``.

    Returns:
      The parsed last stdout line starting with ``{``, or ``{"error": ...}`` with
      the last line of its stderr if it failed or printed none.
    """
    # JAX on the CPU unless the run asks for an accelerator (tools/gpu-check sets
    # GRAINLIKE_BENCH_JAX_PLATFORMS=cuda,cpu on a GPU host).
    platforms = os.environ.get("GRAINLIKE_BENCH_JAX_PLATFORMS", "cpu")
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": platforms, **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--child", *map(str, args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
        start_new_session=True,
    )
    peak = [0]
    done = threading.Event()
    sampler = None
    if peak_rss:
        sampler = threading.Thread(target=_sample_rss, args=(proc.pid, peak, done), daemon=True)
        sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = "", f"timed out after {timeout:g} s"
    finally:
        if proc.poll() is None:  # only the group this function started
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        done.set()
        if sampler is not None:
            sampler.join()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        result = {"error": (err.strip().splitlines() or ["failed"])[-1][:200]}
    else:
        result = json.loads(lines[-1])
    if peak_rss:
        result["peak_mb"] = peak[0] / 1e6
    return result


def _sample_rss(pid: int, peak: list, done: threading.Event) -> None:
    import psutil

    try:
        ps = psutil.Process(pid)
    except psutil.Error:
        return
    while not done.is_set():
        try:
            total = ps.memory_info().rss + sum(c.memory_info().rss for c in ps.children(recursive=True))
            peak[0] = max(peak[0], total)
        except psutil.Error:  # a worker ended between listing and reading it
            pass
        done.wait(0.05)


def median_of(runs: list, key: str) -> float | None:
    """The median of ``key`` over the runs that have it (failed runs have only ``"error"``)."""
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def library_table(results: dict, key: str, column: str) -> list:
    """Markdown rows of each library's median ``key`` and first batch, and grainlike / grain.

    Args:
      results: ``{library: [run results]}`` in report order.
      key: the throughput in each run's result, e.g. ``"records_per_s"``.
      column: its column header, e.g. ``"records/s"``.
    """
    lines = [f"| library | {column} | first batch (s) |", "|---|---|---|"]
    for lib, runs in results.items():
        value, first = median_of(runs, key), median_of(runs, "first_batch_s")
        errors = [r["error"] for r in runs if "error" in r]
        if value is None:
            lines.append(f"| {lib} | error: {errors[0] if errors else '?'} | - |")
        else:
            lines.append(f"| {lib} | {value:,.0f} | {first:.2f} |")
    ours, theirs = median_of(results.get("grainlike", []), key), median_of(results.get("grain", []), key)
    if ours and theirs:
        lines += ["", f"grainlike / grain: **{ours / theirs:.2f}x**"]
    return lines


def library_main(argv: list | None, doc: str, seconds: float, workers: int, measure: Callable, run: Callable) -> int:
    """The command line of a module comparing libraries on one pipeline (``--reps --seconds --workers --libs``).

    With ``--child LIB SECONDS WORKERS`` it prints ``measure(lib, seconds, workers)``
    as JSON (the child's side of ``run_child``); otherwise the markdown of
    ``run(reps, seconds, libs, workers)``.
    """
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=seconds)
    parser.add_argument("--workers", type=int, default=workers)
    parser.add_argument("--libs", default="grainlike,grain")
    parser.add_argument("--child", nargs=3, metavar=("LIB", "SECONDS", "WORKERS"))
    args = parser.parse_args(argv)
    if args.child:
        lib, child_seconds, child_workers = args.child
        print(json.dumps(measure(lib, float(child_seconds), int(child_workers))))
        return 0
    print(run(args.reps, args.seconds, args.libs.split(","), args.workers))
    return 0
