"""W7: packing variable-length token sequences for an LLM, grainlike beside grain 0.2.18.

20k int32 token sequences of 16..1024 tokens (fixed seed) in an ArrayRecord
file (made once), read as
``MapDataset.source(ArrayRecordDataSource).map(decode).to_iter_dataset()``,
packed by ``FirstFitPackIterDataset(length_struct={"tokens": 1024},
num_packing_bins=32)``, batched by 8 and computed in 2 worker processes
(``mp_prefetch``). Each run is a fresh subprocess; the libraries alternate.
Throughput counts the real (non-padding) tokens of the batches after the first.

    tools/bench --only W7
    .venv/bin/python -m benchmarks.packing --reps 3
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

NUM_SEQUENCES = 20_000
MIN_LEN, MAX_LEN = 16, 1024
TARGET = 1024
NUM_BINS = 32
BATCH = 8
WORKERS = 2


def tokens_path() -> str:
    """An ArrayRecord file of int32 token sequences (made once)."""
    path = os.path.join(CACHE, f"tokens-{NUM_SEQUENCES}-{MIN_LEN}-{MAX_LEN}.array_record")
    if os.path.exists(path):
        return path
    from array_record.python.array_record_module import ArrayRecordWriter

    os.makedirs(CACHE, exist_ok=True)
    rng = np.random.default_rng(0)
    tmp = path + f".{os.getpid()}.tmp"
    writer = ArrayRecordWriter(tmp, "group_size:1")
    for n in rng.integers(MIN_LEN, MAX_LEN + 1, NUM_SEQUENCES):
        writer.write(rng.integers(1, 32_000, n, dtype=np.int32).tobytes())
    writer.close()
    os.replace(tmp, path)
    return path


def decode(record: bytes) -> dict:
    return {"tokens": np.frombuffer(record, dtype=np.int32)}


def pipeline(lib_name: str, workers: int = WORKERS):
    if lib_name == "grain":
        import absl.flags

        absl.flags.FLAGS.mark_as_parsed()
        import grain.python as lib
    else:
        import grainlike as lib
    ds = lib.MapDataset.source(lib.ArrayRecordDataSource(tokens_path())).map(decode).to_iter_dataset()
    ds = lib.experimental.FirstFitPackIterDataset(ds, length_struct={"tokens": TARGET}, num_packing_bins=NUM_BINS)
    ds = ds.batch(BATCH)
    if workers:
        ds = ds.mp_prefetch(lib.MultiprocessingOptions(num_workers=workers))
    return ds


def measure(lib_name: str, seconds: float, workers: int = WORKERS) -> dict:
    """Runs in the child: real tokens per second after the first batch."""
    t0 = time.perf_counter()
    it = iter(pipeline(lib_name, workers))
    next(it)
    first = time.perf_counter() - t0
    tokens = batches = 0
    t0 = time.perf_counter()
    for batch in it:
        tokens += int(np.count_nonzero(batch["tokens_segment_ids"]))
        batches += 1
        if time.perf_counter() - t0 > seconds:
            break
    elapsed = time.perf_counter() - t0
    if hasattr(it, "close"):
        it.close()
    return {"tokens_per_s": tokens / elapsed, "batches": batches, "first_batch_s": first}


def _child(lib_name: str, seconds: float, workers: int) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.packing", "--child", lib_name, str(seconds), str(workers)],
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
    tokens_path()  # made once, outside the timed children
    results: dict = {l: [] for l in libs}
    for rep in range(reps):
        for lib in libs:
            r = _child(lib, seconds, workers)
            results[lib].append(r)
            print(f"[{rep + 1}/{reps}] W7 {lib}: {r}", file=sys.stderr)

    def med(lib: str, key: str):
        vals = [r[key] for r in results[lib] if key in r]
        return statistics.median(vals) if vals else None

    lines = [
        f"### W7: packing token sequences ({NUM_SEQUENCES // 1000}k sequences of {MIN_LEN}..{MAX_LEN} "
        f"int32 tokens, FirstFitPackIterDataset(length {TARGET}, {NUM_BINS} bins), batch({BATCH}), "
        f"mp_prefetch({workers} workers))",
        "",
        f"{reps} repetition(s), {seconds:g} s each, medians; real (non-padding) tokens per second.",
        "",
        "| library | tokens/s | first batch (s) |",
        "|---|---|---|",
    ]
    for lib in libs:
        tps, first = med(lib, "tokens_per_s"), med(lib, "first_batch_s")
        errors = [r["error"] for r in results[lib] if "error" in r]
        if tps is None:
            lines.append(f"| {lib} | error: {errors[0] if errors else '?'} | - |")
        else:
            lines.append(f"| {lib} | {tps:,.0f} | {first:.2f} |")
    if "grain" in libs and med("grain", "tokens_per_s") and med("grainlike", "tokens_per_s"):
        lines += ["", f"grainlike / grain: **{med('grainlike', 'tokens_per_s') / med('grain', 'tokens_per_s'):.2f}x**"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
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
