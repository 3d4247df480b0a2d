"""Work that waits: a source or a map sleeping 10 ms per record, with each library's defaults.

The sleep stands for a network read or a call that releases the GIL. Four
pipelines, each with 0 and 2 workers and no ``read_options``:

* ``loader``: ``DataLoader(data_source=Sleeping(), sampler=IndexSampler(shuffle),
  operations=[Batch(8)])``;
* ``dataset``: ``MapDataset.range(n).map(sleep_10ms).to_iter_dataset()``
  (``.mp_prefetch(2 workers)``).

Each configuration runs in a fresh process, libraries interleaved per
repetition; the figure is records/s after the first output, median of the
repetitions. One thread does 100 records/s per process; grain's 16 read threads
about 1,550.

    .venv/bin/python -m benchmarks.waiting --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.child import run_child  # noqa: E402

DELAY_S = 0.01
N = 100_000
CONFIGS = [(api, workers) for api in ("loader", "dataset") for workers in (0, 2)]


class Sleeping:
    """A source of ``N`` ints whose every read sleeps ``DELAY_S``."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, key: int) -> int:
        time.sleep(DELAY_S)
        return key

    def __repr__(self) -> str:
        return f"Sleeping(n={N})"


def sleep_10ms(x):
    time.sleep(DELAY_S)
    return x


def _library(name: str):
    if name == "grain":
        import absl.flags

        absl.flags.FLAGS.mark_as_parsed()
        import grain.python as lib
    else:
        import grainlike as lib
    return lib


def measure(lib_name: str, api: str, workers: int, seconds: float) -> dict:
    """Runs in the child: records/s of one configuration after its first output."""
    # By module name, not __main__'s: worker processes import them.
    from benchmarks.waiting import Sleeping, sleep_10ms

    lib = _library(lib_name)
    if api == "loader":
        sampler = lib.IndexSampler(N, lib.NoSharding(), shuffle=True, num_epochs=1, seed=0)
        pipeline = lib.DataLoader(
            data_source=Sleeping(), sampler=sampler, operations=[lib.Batch(8)], worker_count=workers
        )
        size = len
    else:
        pipeline = lib.MapDataset.range(N).map(sleep_10ms).to_iter_dataset()
        if workers:
            pipeline = pipeline.mp_prefetch(lib.MultiprocessingOptions(num_workers=workers))
        size = lambda _: 1  # noqa: E731
    it = iter(pipeline)
    next(it)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        n += size(next(it))
    return {"records_per_s": n / (time.perf_counter() - start)}


def run(reps: int, seconds: float, libs: list) -> str:
    results: dict = {}
    for rep in range(reps):
        for api, workers in CONFIGS:
            for lib in libs:
                r = run_child("benchmarks.waiting", [lib, api, workers, seconds], timeout=120)
                results.setdefault((api, workers, lib), []).append(r)
                print(f"[{rep + 1}/{reps}] {api} W={workers} {lib}: {r}", file=sys.stderr)
    lines = [
        f"## Work that waits ({DELAY_S * 1e3:.0f} ms per record), library defaults, records/s (median of {reps})",
        "",
        "| pipeline | workers | " + " | ".join(libs) + " |",
        "|---|---|" + "---|" * len(libs),
    ]
    for api, workers in CONFIGS:
        cells = []
        for lib in libs:
            values = [r["records_per_s"] for r in results[(api, workers, lib)] if "records_per_s" in r]
            cells.append(f"{statistics.median(values):,.0f}" if values else "error")
        lines.append(f"| {api} | {workers} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--libs", default="grainlike,grain")
    parser.add_argument("--child", nargs=4, metavar=("LIB", "API", "WORKERS", "SECONDS"))
    args = parser.parse_args()
    if args.child:
        lib, api, workers, seconds = args.child
        print(json.dumps(measure(lib, api, int(workers), float(seconds))), flush=True)
        return
    print(run(args.reps, args.seconds, args.libs.split(",")))


if __name__ == "__main__":
    main()
