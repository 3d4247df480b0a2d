"""W15: iterators that are dropped after a few batches (grain's tutorial pattern), grainlike beside grain 0.2.18.

A tutorial or notebook builds one ``MapDataset`` pipeline and looks at it through
several short-lived iterators: ``next(iter(ds))``, ``for batch in ds: break``,
``zip(range(3), ds)``. Here: 60k MNIST-sized records from a user source (so
``to_iter_dataset()`` reads in grain's 16 threads with its 500-element buffer),
``shuffle``, a decode-and-normalise ``map``, ``batch(32)``; six iterators each
take three batches and are dropped, then a seventh runs a 300-step "training"
loop (one matmul per batch). Each run is a fresh subprocess; the libraries
alternate. Reported: the whole run's wall time and the peak resident memory of
the process, medians.

A dropped iterator that went on filling its buffer would compute up to
500 batches (16,000 records, ~100 MB) that nobody reads, and compete with the
training loop for the CPU.

    tools/bench --only W15
    .venv/bin/python -m benchmarks.dropped_iterators --reps 3
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

NUM_RECORDS = 60_000
BATCH = 32
DROPPED = 6
TAKEN = 3
TRAIN_STEPS = 300


class Digits:
    """MNIST-sized records (a 28x28 uint8 image, stored as bytes, and a label) from a user source."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self._images = rng.integers(0, 256, (NUM_RECORDS, 28 * 28), dtype=np.uint8)
        self._labels = rng.integers(0, 10, NUM_RECORDS)

    def __len__(self) -> int:
        return NUM_RECORDS

    def __getitem__(self, i: int) -> dict:
        return {"image": self._images[i].tobytes(), "label": int(self._labels[i])}


def decode(record: dict) -> dict:
    image = np.frombuffer(record["image"], dtype=np.uint8).reshape(28, 28)
    return {"image": image.astype(np.float32) / 127.5 - 1.0, "label": np.int32(record["label"])}


def pipeline(lib_name: str):
    if lib_name == "grain":
        import absl.flags

        absl.flags.FLAGS.mark_as_parsed()
        import grain.python as lib
    else:
        import grainlike as lib
    return lib.MapDataset.source(Digits()).shuffle(seed=0).map(decode).batch(BATCH)


def _take(it, n: int) -> None:
    for _ in range(n):
        next(it)


def measure(lib_name: str, seconds: float, workers: int) -> dict:
    """Runs in the child: the whole run's wall time (``seconds`` and ``workers`` are not used)."""
    t0 = time.perf_counter()
    ds = pipeline(lib_name)
    first = None
    for i in range(DROPPED):
        # The patterns of a notebook, each iterator dropped at once.
        if i % 3 == 0:
            next(iter(ds.to_iter_dataset()))
        elif i % 3 == 1:
            for _, _batch in zip(range(TAKEN), ds.to_iter_dataset()):
                pass
        else:
            for _batch in ds.to_iter_dataset():
                break
        if first is None:
            first = time.perf_counter() - t0
    weights = np.zeros((28 * 28, 10), np.float32)
    it = iter(ds.to_iter_dataset())
    for _ in range(TRAIN_STEPS):
        batch = next(it)
        x = batch["image"].reshape(len(batch["image"]), -1)
        weights -= 1e-3 * (x.T @ (x @ weights))
    if hasattr(it, "close"):
        it.close()
    return {"seconds": time.perf_counter() - t0, "first_batch_s": first}


def run(reps: int, seconds: float, libs: list[str], workers: int = 0) -> str:
    """Measures each library ``reps`` times, interleaved; returns a markdown section."""
    libs = [l for l in libs if l in ("grainlike", "grain")]
    results: dict = {l: [] for l in libs}
    for rep in range(reps):
        for lib in libs:
            r = run_child("benchmarks.dropped_iterators", [lib, seconds, workers], peak_rss=True)
            results[lib].append(r)
            print(f"[{rep + 1}/{reps}] W15 {lib}: {r}", file=sys.stderr)
    lines = [
        f"### W15: {DROPPED} iterators dropped after at most {TAKEN} batches, then {TRAIN_STEPS} steps "
        f"({NUM_RECORDS // 1000}k MNIST-sized records from a user source, shuffle, map, batch({BATCH}), "
        "to_iter_dataset() defaults)",
        "",
        f"{reps} repetition(s), medians of the whole run (a fresh process each).",
        "",
        "| library | run (s) | peak memory (MB) |",
        "|---|---|---|",
    ]
    for lib, runs in results.items():
        secs, peak = median_of(runs, "seconds"), median_of(runs, "peak_mb")
        if secs is None:
            errors = [r["error"] for r in runs if "error" in r]
            lines.append(f"| {lib} | error: {errors[0] if errors else '?'} | - |")
        else:
            lines.append(f"| {lib} | {secs:.2f} | {peak:,.0f} |")
    ours, theirs = median_of(results.get("grainlike", []), "seconds"), median_of(results.get("grain", []), "seconds")
    if ours and theirs:
        lines += ["", f"grainlike / grain (time): **{ours / theirs:.2f}x**"]
    return "\n".join(lines)


def main(argv=None) -> int:
    return library_main(argv, __doc__, 0.0, 0, measure, run)


if __name__ == "__main__":
    sys.exit(main())
