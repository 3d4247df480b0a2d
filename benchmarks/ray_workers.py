"""W16: the DataLoader's workers as Ray actors (grainlike.ray) beside its worker processes (mp_prefetch).

The W1 pipeline (10^6 small int records, identity map, Batch(128)) and the W2
pipeline (JPEG decode + resize + normalise, crop + flip, Batch(64)), each with
2 workers: once as ``iter(loader)`` (worker processes of this host) and once as
``grainlike.ray.data_loader_iter(loader)`` on a local Ray instance
(``grainlike.ray.init_local(num_cpus=2)``, loopback only). Same batches, same
states; what differs is the transport (Ray calls of many outputs, arrays through
Ray's object store) and the start (Ray's own processes, then one actor per worker).

Reported per configuration (medians, a fresh process each, the two back ends
interleaved): steady-state records/s over ``--seconds``, the time from
``iter()`` to the first batch (for Ray with the instance already running: the
actors' start), and the time Ray itself took to start.

    tools/bench --only W16
    .venv/bin/python -m benchmarks.ray_workers --reps 3 --seconds 4
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.child import median_of, run_child  # noqa: E402

WORKLOADS = {"W1": 128, "W2": 64}
BACKENDS = ("mp", "ray")
_NAMES = {"mp": "worker processes (mp_prefetch)", "ray": "Ray actors (grainlike.ray)"}


def measure(config: str, seconds: float, workers: int) -> dict:
    """Runs in the child: ``config`` is ``"<mp|ray>:<W1|W2>"``."""
    backend, workload = config.split(":")
    from benchmarks import bench

    loader = bench._loader("grainlike", workload, workers, WORKLOADS[workload])
    result: dict = {}
    if backend == "ray":
        import ray

        import grainlike.ray as grain_ray

        t0 = time.perf_counter()
        grain_ray.init_local(num_cpus=max(workers, 1), log_to_driver=False)
        result["ray_start_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        it = grain_ray.data_loader_iter(loader)
    else:
        t0 = time.perf_counter()
        it = iter(loader)
    first = next(it)
    result["first_batch_s"] = time.perf_counter() - t0
    records = 0
    t0 = time.perf_counter()
    for batch in it:
        leaf = next(iter(batch.values())) if isinstance(batch, dict) else batch
        records += int(leaf.shape[0])
        if time.perf_counter() - t0 > seconds:
            break
    result["records_per_s"] = records / (time.perf_counter() - t0)
    del first
    it.close()
    if backend == "ray":
        ray.shutdown()
    return result


def run(reps: int, seconds: float, libs: list[str], workers: int = 2) -> str:
    """Measures both back ends ``reps`` times, interleaved; returns a markdown section (``libs`` unused)."""
    if importlib.util.find_spec("ray") is None:
        return "### W16: DataLoader workers as Ray actors\n\nskipped: Ray is not installed (pip install 'ray>=2.50')"
    results: dict = {}
    for rep in range(reps):
        for workload in WORKLOADS:
            for backend in BACKENDS:
                r = run_child(
                    "benchmarks.ray_workers", [f"{backend}:{workload}", seconds, workers], timeout=300, peak_rss=True
                )
                results.setdefault((workload, backend), []).append(r)
                print(f"[{rep + 1}/{reps}] W16 {workload} {backend}: {r}", file=sys.stderr)
    lines = [
        f"### W16: DataLoader workers as Ray actors, {workers} workers, local Ray instance",
        "",
        f"{reps} repetition(s), {seconds:g} s per throughput run; medians (a fresh process each).",
        "",
        f"| workload | {_NAMES['mp']} records/s | {_NAMES['ray']} records/s | Ray / processes | "
        "first batch (s): processes / Ray | Ray start (s) | peak MB: processes / Ray |",
        "|---|---|---|---|---|---|---|",
    ]
    for workload in WORKLOADS:
        row = {b: results.get((workload, b), []) for b in BACKENDS}
        rate = {b: median_of(row[b], "records_per_s") for b in BACKENDS}
        first = {b: median_of(row[b], "first_batch_s") for b in BACKENDS}
        peak = {b: median_of(row[b], "peak_mb") for b in BACKENDS}
        start = median_of(row["ray"], "ray_start_s")
        if rate["mp"] is None or rate["ray"] is None:
            errors = [r["error"] for b in BACKENDS for r in row[b] if "error" in r]
            lines.append(f"| {workload} | error: {errors[0] if errors else '?'} | | | | | |")
            continue
        lines.append(
            f"| {workload} | {rate['mp']:,.0f} | {rate['ray']:,.0f} | {rate['ray'] / rate['mp']:.2f}x | "
            f"{first['mp']:.2f} / {first['ray']:.2f} | {start:.1f} | {peak['mp']:,.0f} / {peak['ray']:,.0f} |"
        )
    lines += [
        "",
        "- W1: 10^6 small int records, identity map, Batch(128); W2: 20k JPEG 96x96, decode + resize 64 + "
        "normalise, crop 56 + flip, Batch(64).",
        "- First batch for Ray: from `data_loader_iter()` with the Ray instance already running (its actors start); "
        "Ray start: `init_local()` (Ray's own processes), paid once per process.",
        "- Peak MB: the resident memory of the process and its children (Ray's processes included for Ray).",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--child", nargs=3, metavar=("CONFIG", "SECONDS", "WORKERS"))
    args = parser.parse_args(argv)
    if args.child:
        config, child_seconds, child_workers = args.child
        print(json.dumps(measure(config, float(child_seconds), int(child_workers))))
        return 0
    print(run(args.reps, args.seconds, [], args.workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
