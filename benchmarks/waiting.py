"""What runs in read threads by default: work that waits, and CPU-bound maps.

Two tables, every configuration in a fresh process, configurations interleaved
per repetition, medians of the repetitions, the first output not counted:

1. Work that waits, with each library's defaults (no ``read_options``): a
   source or a map sleeping 10 ms per record (a network read, a call that
   releases the GIL), 0 and 2 workers. ``loader``: ``DataLoader(Sleeping(),
   IndexSampler(shuffle), [Batch(8)])``; ``dataset``:
   ``MapDataset.range(n).map(sleep_10ms).to_iter_dataset()`` (and
   ``.mp_prefetch(2 workers)``). One thread reads 100 records/s per process,
   grain's 16 threads about 1,550.
2. CPU-bound work of the user's code, grainlike only: its default (grain's 16
   threads) against the same code declaring ``waits = False`` (the calling
   thread): records/s and CPU time per record of the process and its workers.
   Maps inside a ``MapDataset`` (before ``to_iter_dataset()``, so they run
   where it reads): ``identity`` and ``python`` (a 300-step Python loop) over
   ``MapDataset.range``, ``Batch(128)``; ``decode``: W2's OpenCV decode + resize
   of its JPEG ArrayRecord file, shuffled, ``Batch(64)``. And ``W3 source``:
   W3's DataLoader (256 KiB arrays made on read, ``Batch(32)``), its source
   without and with the declaration.

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
WAITING = [(api, workers) for api in ("loader", "dataset") for workers in (0, 2)]
CPU_BOUND = [("identity", 0), ("python", 0), ("decode", 0), ("decode", 2), ("W3 source", 0)]


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


class CpuMap:
    """A CPU-bound map (``kind``); with ``declared`` it says ``waits = False``."""

    def __init__(self, kind: str, declared: bool):
        self.kind = kind
        if declared:
            self.waits = False

    def __call__(self, x):
        if self.kind == "identity":
            return x
        if self.kind == "python":
            total = 0
            for i in range(300):
                total += i * x
            return total
        from benchmarks.workloads import decode_resize_normalise

        return decode_resize_normalise(x)


class BigArrays:
    """W3's source (``benchmarks.workloads.BigSource``) as a type grainlike does not know.

    With ``declared`` it says ``waits = False``, as ``BigSource`` does.
    """

    def __init__(self, declared: bool):
        from benchmarks.workloads import BigSource

        self._source = BigSource()
        if declared:
            self.waits = False

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, key: int):
        return self._source[key]

    def __repr__(self) -> str:
        return repr(self._source)


def _library(name: str):
    if name == "grain":
        import absl.flags

        absl.flags.FLAGS.mark_as_parsed()
        import grain.python as lib
    else:
        import grainlike as lib
    return lib


def _cpu_seconds() -> float:
    """CPU time of this process and all its descendants (the workers)."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for p in [me] + me.children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:  # a process ended while listed
            pass
    return total


def _rate(pipeline, size, seconds: float) -> dict:
    it = iter(pipeline)
    next(it)
    n, start, cpu = 0, time.perf_counter(), _cpu_seconds()
    while time.perf_counter() - start < seconds:
        n += size(next(it))
    wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    return {"records_per_s": n / wall, "cpu_us_per_record": cpu / n * 1e6}


def measure(lib_name: str, config: str, workers: int, seconds: float) -> dict:
    """Runs in the child: one configuration (``loader``, ``dataset``, or ``cpu:KIND:DECLARED``)."""
    # By module name, not __main__'s: worker processes import them.
    from benchmarks.waiting import BigArrays, CpuMap, Sleeping, sleep_10ms

    lib = _library(lib_name)
    if config == "loader":
        sampler = lib.IndexSampler(N, lib.NoSharding(), shuffle=True, num_epochs=1, seed=0)
        pipeline = lib.DataLoader(
            data_source=Sleeping(), sampler=sampler, operations=[lib.Batch(8)], worker_count=workers
        )
        return _rate(pipeline, len, seconds)
    if config.startswith("cpu:W3 source:"):
        source = BigArrays(config.endswith(":declared"))
        sampler = lib.IndexSampler(len(source), lib.NoSharding(), shuffle=True, num_epochs=None, seed=0)
        pipeline = lib.DataLoader(
            data_source=source, sampler=sampler, operations=[lib.Batch(32)], worker_count=workers
        )
        return _rate(pipeline, len, seconds)
    if config == "dataset":
        ds = lib.MapDataset.range(N).map(sleep_10ms).to_iter_dataset()
    else:
        _, kind, declared = config.split(":")
        fn = CpuMap(kind, declared == "declared")
        if kind == "decode":
            from benchmarks.workloads import images_path

            source = lib.MapDataset.source(lib.ArrayRecordDataSource(images_path())).shuffle(seed=0).repeat()
            ds = source.map(fn).to_iter_dataset().batch(64)
        else:
            ds = lib.MapDataset.range(10**8).map(fn).to_iter_dataset().batch(128)
    if workers:
        ds = ds.mp_prefetch(lib.MultiprocessingOptions(num_workers=workers))
    if config == "dataset":
        return _rate(ds, lambda _: 1, seconds)
    return _rate(ds, lambda b: len(b["label"]) if isinstance(b, dict) else len(b), seconds)


def _median(runs: list, key: str):
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def run(reps: int, seconds: float, libs: list) -> str:
    plan = [(lib, api, w) for api, w in WAITING for lib in libs]
    plan += [("grainlike", f"cpu:{kind}:{d}", w) for kind, w in CPU_BOUND for d in ("default", "declared")]
    results: dict = {}
    for rep in range(reps):
        for lib, config, workers in plan:
            r = run_child("benchmarks.waiting", [lib, config, workers, seconds], timeout=180)
            results.setdefault((lib, config, workers), []).append(r)
            print(f"[{rep + 1}/{reps}] {config} W={workers} {lib}: {r}", file=sys.stderr)
    lines = [
        f"## Work that waits ({DELAY_S * 1e3:.0f} ms per record), library defaults: records/s, median of {reps}",
        "",
        "| pipeline | workers | " + " | ".join(libs) + " |",
        "|---|---|" + "---|" * len(libs),
    ]
    for api, workers in WAITING:
        cells = []
        for lib in libs:
            value = _median(results[(lib, api, workers)], "records_per_s")
            cells.append("error" if value is None else f"{value:,.0f}")
        lines.append(f"| {api} | {workers} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"## CPU-bound user code, grainlike: default (16 threads) vs `waits = False`, median of {reps}",
        "",
        "| work | workers | default records/s | declared records/s | default CPU us/record | declared CPU us/record |",
        "|---|---|---|---|---|---|",
    ]
    for kind, workers in CPU_BOUND:
        cells = []
        for key, fmt in (("records_per_s", "{:,.0f}"), ("cpu_us_per_record", "{:.2f}")):
            for declared in ("default", "declared"):
                value = _median(results[("grainlike", f"cpu:{kind}:{declared}", workers)], key)
                cells.append("error" if value is None else fmt.format(value))
        lines.append(f"| {kind} | {workers} | " + " | ".join([cells[0], cells[1], cells[2], cells[3]]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--libs", default="grainlike,grain")
    parser.add_argument("--child", nargs=4, metavar=("LIB", "CONFIG", "WORKERS", "SECONDS"))
    args = parser.parse_args()
    if args.child:
        lib, config, workers, seconds = args.child
        print(json.dumps(measure(lib, config, int(workers), float(seconds))), flush=True)
        return
    print(run(args.reps, args.seconds, args.libs.split(",")))


if __name__ == "__main__":
    main()
