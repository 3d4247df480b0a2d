"""W14: one TFRecord file read from start to end, grainlike beside grain 0.2.18.

Four files of random bytes (fixed seeds; made once): 300 records of 1 MiB,
100,000 of 200 B, 100,000 of 100-300 B (uniform) and 5,000 of 32 KiB. Each is
read in one process, no workers, as
``TFRecordIterDataset(path)``: the file is read whole once to warm the page
cache, then passes over it are timed until the time is up. grainlike verifies
both CRC-32Cs of every record (the length's and the data's); grain verifies
neither. Each run is a fresh subprocess; the libraries alternate. The rates
are record bytes per second of wall-clock time and per second of the
process's CPU time (which other processes on a busy machine disturb less).

    tools/bench --only W14
    .venv/bin/python -m benchmarks.tfrecord_read --reps 5
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.child import library_main, median_of, run_child  # noqa: E402
from benchmarks.workloads import cached_file  # noqa: E402

# (records, fewest bytes per record, most bytes per record)
FILES = [(300, 1 << 20, 1 << 20), (100_000, 200, 200), (100_000, 100, 300), (5_000, 32 << 10, 32 << 10)]


def file_path(records: int, low: int, high: int) -> str:
    """The TFRecord file of ``records`` random records of ``low`` to ``high`` bytes (made once)."""
    from grainlike.dataset.sources.tfrecord import write_tfrecords

    def write(path: str) -> None:
        rng = np.random.default_rng(high)
        lengths = [low] * records if low == high else rng.integers(low, high, records, endpoint=True)
        write_tfrecords(path, (rng.bytes(int(n)) for n in lengths))

    name = f"{low}" if low == high else f"{low}-{high}"
    return cached_file(f"random-{records}x{name}.tfrecord", write)


def _label(records: int, low: int, high: int) -> str:
    def size(n: int) -> str:
        return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n}"

    sizes = size(low) if low == high else f"{size(low)}-{size(high)}"
    return f"{records:,} x {sizes}" + ("" if sizes.endswith("B") else " B")


def _dataset(lib_name: str, path: str):
    if lib_name == "grain":
        import absl.flags

        absl.flags.FLAGS.mark_as_parsed()
        import grain.python as lib
    else:
        import grainlike as lib
    return lib.experimental.TFRecordIterDataset(path)


def measure(lib_name: str, seconds: float, file_index: int) -> dict:
    """Runs in the child: record bytes per second over whole passes of the file."""
    records, low, high = FILES[file_index]
    path = file_path(records, low, high)
    with open(path, "rb") as f:  # The page cache holds the file from now on.
        while f.read(64 << 20):
            pass
    ds = _dataset(lib_name, path)
    passes = 0
    total = 0
    t0, cpu0 = time.perf_counter(), time.process_time()
    while passes == 0 or time.perf_counter() - t0 < seconds:
        count = 0
        for record in ds:
            total += len(record)
            count += 1
        assert count == records, (count, records)
        passes += 1
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "bytes_per_s": total / elapsed,
        "bytes_per_cpu_s": total / cpu,
        "records_per_s": passes * records / elapsed,
        "passes": passes,
    }


def run(reps: int, seconds: float, libs: list[str], workers: int = 0) -> str:
    """Measures each library and file ``reps`` times, interleaved; returns a markdown section."""
    libs = [l for l in libs if l in ("grainlike", "grain")]
    for spec in FILES:
        file_path(*spec)  # made once, outside the timed children
    results: dict = {}
    for rep in range(reps):
        for i, spec in enumerate(FILES):
            for lib in libs:
                r = run_child("benchmarks.tfrecord_read", [lib, seconds, i])
                results.setdefault((i, lib), []).append(r)
                print(f"[{rep + 1}/{reps}] W14 {_label(*spec)} {lib}: {r}", file=sys.stderr)

    lines = [
        "### W14: one TFRecord file read sequentially (TFRecordIterDataset, no workers, page cache warm)",
        "",
        f"{reps} repetition(s), {seconds:g} s each, medians; MB of record bytes per second of wall-clock "
        "time, and per second of CPU time. grainlike verifies both CRC-32Cs of every record; grain "
        "verifies none.",
        "",
        "| file | rate | " + " | ".join(libs) + " | grainlike / grain |",
        "|---|---|" + "---|" * (len(libs) + 1),
    ]
    for i, spec in enumerate(FILES):
        for key, label in (("bytes_per_s", "MB/s"), ("bytes_per_cpu_s", "MB per CPU s")):
            cells = []
            rates = {}
            for lib in libs:
                runs = results.get((i, lib), [])
                rates[lib] = median_of(runs, key)
                errors = [r["error"] for r in runs if "error" in r]
                cells.append(f"{rates[lib] / 1e6:,.0f}" if rates[lib] else f"error: {errors[0] if errors else '?'}")
            ours, theirs = rates.get("grainlike"), rates.get("grain")
            ratio = f"**{ours / theirs:.2f}x**" if ours and theirs else "-"
            lines.append(f"| {_label(*spec)} | {label} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    # --workers is library_main's third child argument; here it picks the file.
    return library_main(argv, __doc__, 3.0, 0, measure, run)


if __name__ == "__main__":
    sys.exit(main())
