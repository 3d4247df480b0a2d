"""W11: TFRecord files interleaved in worker processes, grainlike beside grain 0.2.18.

8 TFRecord files of 5,000 records each (1 KiB of int32 tokens per record, fixed
seed; made once), read as
``InterleaveIterDataset([TFRecordIterDataset(f).map(decode) ...], cycle_length=4)``,
batched by 64 and computed in 2 worker processes (``mp_prefetch``: each worker
interleaves its share of the files). grainlike checks each record's CRC-32C,
grain does not. Each run is a fresh subprocess; the libraries alternate.
Throughput counts records of the batches after the first.

    tools/bench --only W11
    .venv/bin/python -m benchmarks.tfrecord_interleave --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.workloads import CACHE  # noqa: E402

FILES = 8
RECORDS = 5_000
RECORD_BYTES = 1024
CYCLE = 4
BATCH = 64
WORKERS = 2


def file_paths() -> list:
    """The TFRecord files (made once)."""
    from grainlike.dataset.tfrecord import write_tfrecords

    paths = [os.path.join(CACHE, f"tokens-{RECORDS}x{RECORD_BYTES}-{i}.tfrecord") for i in range(FILES)]
    rng = np.random.default_rng(0)
    os.makedirs(CACHE, exist_ok=True)
    for path in paths:
        records = rng.integers(1, 32_000, (RECORDS, RECORD_BYTES // 4), dtype=np.int32)
        if not os.path.exists(path):
            tmp = path + f".{os.getpid()}.tmp"
            write_tfrecords(tmp, list(records))
            os.replace(tmp, path)
    return paths


def decode(record: bytes) -> np.ndarray:
    return np.frombuffer(record, dtype=np.int32)


def pipeline(lib_name: str, workers: int = WORKERS):
    if lib_name == "grain":
        import absl.flags

        absl.flags.FLAGS.mark_as_parsed()
        import grain.python as lib
    else:
        import grainlike as lib
    files = [lib.experimental.TFRecordIterDataset(p).map(decode) for p in file_paths()]
    ds = lib.experimental.InterleaveIterDataset(files, cycle_length=CYCLE).batch(BATCH)
    if workers:
        ds = ds.mp_prefetch(lib.MultiprocessingOptions(num_workers=workers))
    return ds


def measure(lib_name: str, seconds: float, workers: int = WORKERS) -> dict:
    """Runs in the child: records per second after the first batch."""
    t0 = time.perf_counter()
    it = iter(pipeline(lib_name, workers))
    next(it)
    first = time.perf_counter() - t0
    records = 0
    t0 = time.perf_counter()
    for batch in it:
        records += len(batch)
        if time.perf_counter() - t0 > seconds:
            break
    elapsed = time.perf_counter() - t0
    if hasattr(it, "close"):
        it.close()
    return {"records_per_s": records / elapsed, "first_batch_s": first}


def _child(lib_name: str, seconds: float, workers: int) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.tfrecord_interleave", "--child", lib_name, str(seconds), str(workers)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:  # only the group this function started
            os.killpg(proc.pid, 9)
            proc.communicate()
    lines = [l for l in out.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (err.strip().splitlines() or ["failed"])[-1][:200]}
    return json.loads(lines[-1])


def run(reps: int, seconds: float, libs: list[str], workers: int = WORKERS) -> str:
    """Measures each library ``reps`` times, interleaved; returns a markdown section."""
    libs = [l for l in libs if l in ("grainlike", "grain")]
    file_paths()  # made once, outside the timed children
    results: dict = {l: [] for l in libs}
    for rep in range(reps):
        for lib in libs:
            r = _child(lib, seconds, workers)
            results[lib].append(r)
            print(f"[{rep + 1}/{reps}] W11 {lib}: {r}", file=sys.stderr)

    def med(lib: str, key: str):
        vals = [r[key] for r in results[lib] if key in r]
        return statistics.median(vals) if vals else None

    lines = [
        f"### W11: {FILES} TFRecord files of {RECORDS:,} records of {RECORD_BYTES} B, "
        f"InterleaveIterDataset(cycle_length={CYCLE}), batch({BATCH}), mp_prefetch({workers} workers)",
        "",
        f"{reps} repetition(s), {seconds:g} s each, medians; records per second. grainlike checks "
        "every record's CRC-32C; grain does not.",
        "",
        "| library | records/s | first batch (s) |",
        "|---|---|---|",
    ]
    for lib in libs:
        rps, first = med(lib, "records_per_s"), med(lib, "first_batch_s")
        errors = [r["error"] for r in results[lib] if "error" in r]
        if rps is None:
            lines.append(f"| {lib} | error: {errors[0] if errors else '?'} | - |")
        else:
            lines.append(f"| {lib} | {rps:,.0f} | {first:.2f} |")
    if "grain" in libs and med("grain", "records_per_s") and med("grainlike", "records_per_s"):
        lines += ["", f"grainlike / grain: **{med('grainlike', 'records_per_s') / med('grain', 'records_per_s'):.2f}x**"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--libs", default="grainlike,grain")
    parser.add_argument("--child", nargs=3, metavar=("LIB", "SECONDS", "WORKERS"))
    args = parser.parse_args(argv)
    if args.child:
        lib, seconds, workers = args.child
        print(json.dumps(measure(lib, float(seconds), int(workers))))
        return 0
    print(run(args.reps, args.seconds, args.libs.split(","), args.workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
