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

import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.child import library_main, library_table, run_child  # noqa: E402
from benchmarks.workloads import cached_file  # noqa: E402

FILES = 8
RECORDS = 5_000
RECORD_BYTES = 1024
CYCLE = 4
BATCH = 64
WORKERS = 2


def file_paths() -> list:
    """The TFRecord files (made once)."""
    from grainlike.dataset.sources.tfrecord import write_tfrecords

    rng = np.random.default_rng(0)
    paths = []
    for i in range(FILES):
        # Drawn for every file, written or not, so that each file's records stay the same.
        records = list(rng.integers(1, 32_000, (RECORDS, RECORD_BYTES // 4), dtype=np.int32))
        name = f"tokens-{RECORDS}x{RECORD_BYTES}-{i}.tfrecord"
        paths.append(cached_file(name, lambda path, records=records: write_tfrecords(path, records)))
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


def run(reps: int, seconds: float, libs: list[str], workers: int = WORKERS) -> str:
    """Measures each library ``reps`` times, interleaved; returns a markdown section."""
    libs = [l for l in libs if l in ("grainlike", "grain")]
    file_paths()  # made once, outside the timed children
    results: dict = {l: [] for l in libs}
    for rep in range(reps):
        for lib in libs:
            r = run_child("benchmarks.tfrecord_interleave", [lib, seconds, workers])
            results[lib].append(r)
            print(f"[{rep + 1}/{reps}] W11 {lib}: {r}", file=sys.stderr)

    lines = [
        f"### W11: {FILES} TFRecord files of {RECORDS:,} records of {RECORD_BYTES} B, "
        f"InterleaveIterDataset(cycle_length={CYCLE}), batch({BATCH}), mp_prefetch({workers} workers)",
        "",
        f"{reps} repetition(s), {seconds:g} s each, medians; records per second. grainlike checks "
        "every record's CRC-32C; grain does not.",
        "",
    ]
    lines += library_table(results, "records_per_s", "records/s")
    return "\n".join(lines)


def main(argv=None) -> int:
    return library_main(argv, __doc__, 4.0, WORKERS, measure, run)


if __name__ == "__main__":
    sys.exit(main())
