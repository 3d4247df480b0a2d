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

import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.child import library_main, library_table, run_child  # noqa: E402
from benchmarks.workloads import cached_file  # noqa: E402

NUM_SEQUENCES = 20_000
MIN_LEN, MAX_LEN = 16, 1024
TARGET = 1024
NUM_BINS = 32
BATCH = 8
WORKERS = 2


def tokens_path() -> str:
    """An ArrayRecord file of int32 token sequences (made once)."""
    return cached_file(f"tokens-{NUM_SEQUENCES}-{MIN_LEN}-{MAX_LEN}.array_record", _write_tokens)


def _write_tokens(path: str) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    rng = np.random.default_rng(0)
    writer = ArrayRecordWriter(path, "group_size:1")
    for n in rng.integers(MIN_LEN, MAX_LEN + 1, NUM_SEQUENCES):
        writer.write(rng.integers(1, 32_000, n, dtype=np.int32).tobytes())
    writer.close()


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


def run(reps: int, seconds: float, libs: list[str], workers: int = WORKERS) -> str:
    """Measures each library ``reps`` times, interleaved; returns a markdown section."""
    libs = [l for l in libs if l in ("grainlike", "grain")]
    tokens_path()  # made once, outside the timed children
    results: dict = {l: [] for l in libs}
    for rep in range(reps):
        for lib in libs:
            r = run_child("benchmarks.packing", [lib, seconds, workers])
            results[lib].append(r)
            print(f"[{rep + 1}/{reps}] W7 {lib}: {r}", file=sys.stderr)

    lines = [
        f"### W7: packing token sequences ({NUM_SEQUENCES // 1000}k sequences of {MIN_LEN}..{MAX_LEN} "
        f"int32 tokens, FirstFitPackIterDataset(length {TARGET}, {NUM_BINS} bins), batch({BATCH}), "
        f"mp_prefetch({workers} workers))",
        "",
        f"{reps} repetition(s), {seconds:g} s each, medians; real (non-padding) tokens per second.",
        "",
    ]
    lines += library_table(results, "tokens_per_s", "tokens/s")
    return "\n".join(lines)


def main(argv=None) -> int:
    return library_main(argv, __doc__, 6.0, WORKERS, measure, run)


if __name__ == "__main__":
    sys.exit(main())
