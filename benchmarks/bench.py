"""grainlike against grain 0.2.18 and torch's DataLoader, in one run, interleaved.

Every measurement runs in a fresh subprocess (A, B, C, A, B, C, ...), so the
libraries see the same machine state; the parent samples the resident memory of
the subprocess and all its children. Figures are medians over the repetitions;
the ratios are what to compare across machines.

    tools/bench                    # everything (~10 minutes on 2 cores)
    tools/bench --quick            # shorter runs, one repetition
    tools/bench --only W1,W4       # some workloads
    tools/bench --plot docs/bench.png --json out.json   # also a bar chart of the ratios
    tools/bench --from-json out.json --plot docs/bench.png  # the report and chart again
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.child import median_of, run_child  # noqa: E402

# The plan a ``floors`` child measures for (set from its arguments).
PLAN_IN_USE: list = []
# (workload, worker counts, batch size)
PLAN = [
    ("W1", [0, 2], 128),
    ("W2", [0, 1, 2], 64),
    ("W3", [0, 2], 32),
    ("W4", [0, 2], 128),
    ("W4j", [2], 128),
    ("W4c", [2], 128),
    ("W4k", [2], 128),
    ("W5", [0, 2], 128),
    ("W6", [2], 64),
]
# Workloads with their own module: each module has
# ``run(reps: int, seconds: float, libs: list[str]) -> str`` that measures
# grainlike beside its peers (in fresh subprocesses, interleaved) and returns a
# markdown section for the report.
SECTIONS: dict[str, str] = {
    "W7": "benchmarks.packing",
    "W8": "benchmarks.checkpoint_save",
    "W9": "benchmarks.in_jit",
    "W10": "benchmarks.remote",
    "W11": "benchmarks.tfrecord_interleave",
    "W12": "benchmarks.device_feed",
    "W14": "benchmarks.tfrecord_read",
    "W15": "benchmarks.dropped_iterators",
    "W16": "benchmarks.ray_workers",
}
DESCRIPTIONS = {
    "W1": "1e6 small int records, identity map, Batch(128): records/s",
    "W2": "20k JPEG 96x96 -> decode+resize 64+normalise, crop 56+flip, Batch(64): images/s",
    "W3": "256 KiB float32 records, Batch(32): MB/s",
    "W4": "iter() to first batch in a fresh process (W1 pipeline): seconds",
    "W4b": "the same for a second iterator in that process (new epoch / restart): seconds",
    "W4j": "W4 in a training script: the library imported at the top, then jax.devices() and one jitted"
    " call, then the loader: seconds",
    "W4c": "W4 after an ArrayRecord reader was opened and read and OpenCV imported and used: seconds",
    "W4k": "W4 in a Jupyter kernel: one cell imports the library, the next (run right after) builds the"
    " loader and takes the first batch: seconds",
    "W5": "get_state + set_state + first batch after restore (W1 pipeline): seconds",
    "W6": "Dataset API, MaxText-style: source(W2 images).shuffle.repeat[0::1].to_iter_dataset"
    ".map(decode).random_map(crop_flip).batch(64).mp_prefetch(W workers): images/s",
}


# -- one measurement (runs in a subprocess) -------------------------------------------


# Throughput workloads run shuffled epochs back to back for the whole time budget,
# so that a fast loader is measured in its steady state, not while its workers
# start or its last epoch drains (W1's 10^6 records take grainlike 0.3 s).
_STEADY = ("W1", "W2", "W3")


def _loader(lib_name: str, workload: str, workers: int, batch: int):
    from benchmarks import workloads

    epochs = None if workload in _STEADY else 1

    if lib_name == "torch":
        import torch
        import torch.utils.data
        from benchmarks import torch_ops

        if workload in ("W1",) + _FIRST_BATCH:
            ds = torch_ops.Small(workloads.N_SMALL)
        elif workload == "W2":
            ds = torch_ops.Images(workloads.images_path())
        else:
            ds = torch_ops.Big(workloads.BigSource())
        g = torch.Generator()
        g.manual_seed(0)
        # One fresh permutation per epoch, as shuffle=True draws, for up to 100 epochs.
        sampler = torch.utils.data.RandomSampler(ds, num_samples=len(ds) * (100 if epochs is None else 1), generator=g)
        return torch.utils.data.DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers)

    if lib_name == "grain":
        from benchmarks import grain_ops as ops

        lib = ops.lib
    else:
        from benchmarks import grainlike_ops as ops

        lib = ops.lib
    if workload == "W6":
        return workloads.maxtext_style(lib, ops, workers, batch)
    if workload in ("W1", "W5") + _FIRST_BATCH:
        source = lib.RangeDataSource(0, workloads.N_SMALL, 1)
        operations = [ops.Identity(), lib.Batch(batch)]
    elif workload == "W2":
        source = lib.ArrayRecordDataSource(workloads.images_path())
        operations = [ops.DecodeResize(), ops.CropFlip(), lib.Batch(batch)]
    else:
        source = workloads.BigSource()
        operations = [lib.Batch(batch)]
    sampler = lib.IndexSampler(len(source), lib.NoSharding(), shuffle=True, num_epochs=epochs, seed=0)
    return lib.DataLoader(data_source=source, sampler=sampler, operations=operations, worker_count=workers)


def _count(batch) -> tuple[int, int]:
    """(records, bytes) in a batch of any of the libraries."""
    import numpy as np

    leaves = list(batch.values()) if isinstance(batch, dict) else [batch]
    n = int(leaves[0].shape[0])
    nbytes = sum(int(np.asarray(x).nbytes) if not hasattr(x, "element_size") else x.numel() * x.element_size() for x in leaves)
    return n, nbytes


def _import_library(lib_name: str) -> None:
    """Imports the library as a script does at its top, before its own set-up."""
    import importlib

    importlib.import_module({"torch": "torch.utils.data", "grain": "grain.python"}.get(lib_name, lib_name))


def _host_setup(workload: str) -> list:
    """What a training script has done before its first batch; returns what must stay alive."""
    import numpy as np

    if workload == "W4j":
        import jax
        import jax.numpy as jnp

        jax.devices()
        jax.jit(lambda x: x * 2 + 1)(jnp.ones(8)).block_until_ready()
        return []
    if workload == "W4c":
        import cv2
        from array_record.python.array_record_data_source import ArrayRecordDataSource

        from benchmarks import workloads

        reader = ArrayRecordDataSource(workloads.images_path())
        reader[0]
        cv2.resize(np.zeros((512, 512, 3), np.uint8), (128, 128))
        return [reader]
    return []


def measure_in_kernel(lib_name: str, workers: int, batch: int) -> dict:
    """W4k: the first batch in a Jupyter kernel, the import one cell before the loader."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", env={**os.environ, "PYTHONPATH": ROOT})
    try:
        out: list = []

        def run(code: str) -> None:
            reply = kc.execute_interactive(
                code, timeout=120, output_hook=lambda m: out.append(m["content"].get("text", ""))
            )
            if reply["content"]["status"] != "ok":
                raise RuntimeError(f"kernel cell failed: {reply['content'].get('evalue')}")

        run(f"import sys; sys.path.insert(0, {ROOT!r}); from benchmarks import bench; bench._import_library({lib_name!r})")
        run(f"import json; print(json.dumps(bench.measure({lib_name!r}, 'W4', {workers}, {batch}, 0)))")
        return json.loads("".join(out).strip().splitlines()[-1])
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def measure(lib_name: str, workload: str, workers: int, batch: int, seconds: float) -> dict:
    if workload == "W4k":
        return measure_in_kernel(lib_name, workers, batch)
    if workload in ("W4j", "W4c"):
        _import_library(lib_name)
        keep = _host_setup(workload)  # noqa: F841  (alive while the loader starts)
    loader = _loader(lib_name, workload, workers, batch)
    t0 = time.perf_counter()
    it = iter(loader)
    first = next(it)
    t_first = time.perf_counter() - t0
    result = {"first_batch_s": t_first}
    if workload in _FIRST_BATCH:
        # A second iterator in the same process (a new epoch, a restart): what
        # each library keeps warm between iterators shows here.
        del it
        t0 = time.perf_counter()
        it = iter(loader)
        next(it)
        result["second_first_batch_s"] = time.perf_counter() - t0
        return result
    if workload == "W5":
        for _ in range(5):
            next(it)
        t0 = time.perf_counter()
        state = it.get_state()
        it2 = iter(loader)
        it2.set_state(state)
        next(it2)
        result["restore_s"] = time.perf_counter() - t0
        return result
    records = nbytes = batches = 0
    # The calling process's CPU (all its threads, not the workers') per delivered
    # batch: with many workers this process is what limits the rate.
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for b in it:
        n, nb = _count(b)
        records += n
        nbytes += nb
        batches += 1
        if time.perf_counter() - t0 > seconds:
            break
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    result.update(records_per_s=records / elapsed, mb_per_s=nbytes / elapsed / 1e6, records=records)
    if workers and batches:
        result["consumer_cpu_ms_per_batch"] = 1e3 * cpu / batches
    del first
    return result


def floors() -> dict:
    """The machine's limits for W2 and W3, measured on the same data."""
    import numpy as np

    from benchmarks import workloads
    from grainlike import ArrayRecordDataSource

    src = ArrayRecordDataSource(workloads.images_path())
    n = 4000
    t0 = time.perf_counter()
    for lo in range(0, n, 256):
        src.__getitems__(list(range(lo, min(lo + 256, n))))
    read = n / (time.perf_counter() - t0)
    records = src.__getitems__(list(range(1000)))
    rng = np.random.default_rng(0)
    import cv2

    cv2.setNumThreads(1)  # one core: the floor per core
    t0 = time.perf_counter()
    for r in records:
        workloads.crop_flip(workloads.decode_resize_normalise(r), rng)
    decode = len(records) / (time.perf_counter() - t0)
    a = np.ones(64 << 20, np.uint8)
    b = np.empty_like(a)
    t0 = time.perf_counter()
    for _ in range(5):
        np.copyto(b, a)
    memcpy = 5 * a.nbytes / (time.perf_counter() - t0) / 1e6
    result = {"arrayrecord_read_per_s": read, "decode_per_core_per_s": decode, "memcpy_mb_per_s": memcpy}
    workers = max(w for _, counts, _ in PLAN_IN_USE for w in counts) if PLAN_IN_USE else 0
    if workers > 1:
        result["decode_parallel_processes"] = workers
        result["decode_parallel_per_s"] = _decode_in_parallel(records, workers)
    return result


def _decode_loop(args) -> float:
    records, seconds = args
    import cv2
    import numpy as np

    from benchmarks import workloads

    cv2.setNumThreads(1)
    rng = np.random.default_rng(0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for r in records[:200]:
            workloads.crop_flip(workloads.decode_resize_normalise(r), rng)
        n += 200
    return n / (time.perf_counter() - t0)


def _decode_in_parallel(records: list, processes: int, seconds: float = 2.0) -> float:
    """W2's per-image work in ``processes`` processes at once, images/s together: what the
    machine's cores give when all are busy (shared physical cores, clocks, caches),
    the ceiling for that many workers."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(processes) as pool:
        return sum(pool.map(_decode_loop, [(records[:200], seconds)] * processes))


# -- the parent: interleave, sample memory, report ---------------------------------------


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="steady-state time per run")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="", help="comma-separated workloads, e.g. W1,W4")
    parser.add_argument("--libs", default="grainlike,grain,torch")
    parser.add_argument(
        "--workers", default="",
        help="worker counts for every workload instead of the plan's, e.g. 0,8,15 on a 16-core host",
    )
    parser.add_argument("--json", default="", help="also write all results here")
    parser.add_argument("--plot", default="", help="also draw the ratios to peers as a bar chart (PNG) here")
    parser.add_argument("--from-json", default="", help="report (and plot) the results saved by --json; runs nothing")
    parser.add_argument("--child", nargs=5, metavar=("LIB", "WORKLOAD", "WORKERS", "BATCH", "SECONDS"))
    args = parser.parse_args(argv)

    if args.child:
        lib, workload, workers, batch, seconds = args.child
        if lib == "floors":
            global PLAN_IN_USE
            PLAN_IN_USE = [("W2", [int(workers)], 0)]
            print(json.dumps(floors()))
        else:
            print(json.dumps(measure(lib, workload, int(workers), int(batch), float(seconds))))
        return 0

    if args.quick:
        args.reps, args.seconds = 1, 2.0
    libs = [l for l in args.libs.split(",") if l == "grainlike" or _have(l)]
    only = {w.strip() for w in args.only.split(",") if w.strip()}
    plan = [p for p in PLAN if not only or p[0] in only]
    if args.workers:
        counts = [int(w) for w in args.workers.split(",")]
        # A first batch with no workers is the same in every set-up: W4 measures it.
        plan = [(k, [w for w in counts if w or k in ("W1", "W2", "W3", "W4", "W5")], b) for k, _, b in plan]
    sections = [(k, m) for k, m in SECTIONS.items() if not only or k in only]

    from benchmarks import workloads

    if args.from_json:
        results, floor = _load_results(args.from_json)
        libs = [l for l in libs if any(k[2] == l for k in results)]
        print(_report(results, libs, plan, floor, args))
        if args.plot:
            plot(results, libs, plan, args.plot)
        return 0
    if any(p[0] in ("W2", "W6") for p in plan):
        print(f"preparing {workloads.images_path()} ...", file=sys.stderr)
    results: dict = {}
    for rep in range(args.reps):
        for workload, worker_counts, batch in plan:
            for w in worker_counts:
                for lib in libs:
                    if workload in ("W5", "W6") and lib == "torch":
                        continue  # torch has no iterator state, nor grain's Dataset API
                    r = run_child("benchmarks.bench", [lib, workload, w, batch, args.seconds], timeout=180, peak_rss=True)
                    results.setdefault((workload, w, lib), []).append(r)
                    print(f"[{rep + 1}/{args.reps}] {workload} W={w} {lib}: {r}", file=sys.stderr)
    most = max([w for k, counts, _ in plan if k in ("W2", "W6") for w in counts] or [0])
    floor = run_child("benchmarks.bench", ["floors", "-", most, 0, 0]) if any(p[0] in ("W2", "W3", "W6") for p in plan) else {}

    report = _report(results, libs, plan, floor, args) if plan else ""
    for key, module in sections:
        import importlib

        print(f"running {key} ({module}) ...", file=sys.stderr)
        section = importlib.import_module(module)
        if key == "W12":  # by worker count: the loader against the device's own rate
            counts = [int(w) for w in args.workers.split(",") if int(w) > 0] if args.workers else [2]
            report += "\n\n" + section.run(args.reps, args.seconds, libs, counts)
        else:
            report += "\n\n" + section.run(args.reps, args.seconds, libs)
    print(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"|".join(map(str, k)): v for k, v in results.items()} | {"floors": floor}, f, indent=1)
    if args.plot:
        plot(results, libs, plan, args.plot)
    return 0


def _load_results(path: str) -> tuple[dict, dict]:
    """The results and floors that ``--json`` wrote."""
    with open(path) as f:
        saved = json.load(f)
    floor = saved.pop("floors", {})
    results = {}
    for key, runs in saved.items():
        workload, workers, lib = key.split("|")
        results[(workload, int(workers), lib)] = runs
    return results, floor


_METRIC = {"W1": "records_per_s", "W2": "records_per_s", "W3": "mb_per_s", "W4": "first_batch_s",
           "W4b": "second_first_batch_s", "W4j": "first_batch_s", "W4c": "first_batch_s",
           "W4k": "first_batch_s", "W5": "restore_s", "W6": "records_per_s"}
_TIMES = ("W4", "W4b", "W4j", "W4c", "W4k", "W5")
# First-batch workloads on the W1 pipeline, each after its own set-up (``_host_setup``).
_FIRST_BATCH = ("W4", "W4j", "W4c", "W4k")


def ratios(results: dict, libs: list, plan: list) -> list:
    """``(label, peer, ratio)``: how many times better grainlike did than each peer.

    Throughputs: grainlike's over the peer's; times (W4, W4b, W5): the peer's
    over grainlike's. Above 1, grainlike is ahead.
    """
    out = []
    for workload, worker_counts, _ in plan:
        for name in [workload] + (["W4b"] if workload == "W4" else []):
            metric = _METRIC[name]
            for w in worker_counts:
                ours = median_of(results.get((workload, w, "grainlike"), []), metric)
                for peer in libs:
                    if peer == "grainlike":
                        continue
                    theirs = median_of(results.get((workload, w, peer), []), metric)
                    if not ours or not theirs:
                        continue
                    out.append((f"{name} W={w}", peer, theirs / ours if name in _TIMES else ours / theirs))
    return out


def plot(results: dict, libs: list, plan: list, path: str) -> None:
    """Draws ``ratios()`` as grouped bars on a log scale, one group per workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = ratios(results, libs, plan)
    labels = list(dict.fromkeys(r[0] for r in rows))
    peers = [l for l in libs if l != "grainlike" and any(r[1] == l for r in rows)]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(labels) + 2), 4.2))
    width = 0.8 / max(len(peers), 1)
    for j, peer in enumerate(peers):
        xs, ys = [], []
        for i, label in enumerate(labels):
            for r in rows:
                if r[0] == label and r[1] == peer:
                    xs.append(i + (j - (len(peers) - 1) / 2) * width)
                    ys.append(r[2])
        bars = ax.bar(xs, ys, width, label=f"grainlike vs {peer}")
        ax.bar_label(bars, labels=[f"{y:.2f}x" if y < 10 else f"{y:.0f}x" for y in ys], fontsize=7, padding=1)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_ylabel("times better than the peer (log; >1: grainlike ahead)")
    ax.set_title("tools/bench: grainlike against its peers, same run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}", file=sys.stderr)


def _report(results: dict, libs: list, plan: list, floor: dict, args) -> str:
    import platform

    metric = _METRIC
    lines = [
        f"machine: {os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}; "
        f"{args.reps} repetition(s), {args.seconds:g} s per throughput run; medians",
        "",
        "| workload | W | " + " | ".join(libs) + " | " + " | ".join(f"grainlike/{l}" for l in libs[1:]) + " | first batch (s) | peak MB |",
        "|---|---|" + "---|" * (2 * len(libs) - 1) + "---|---|",
    ]
    rows = []
    for workload, worker_counts, b in plan:
        rows.append((workload, workload, worker_counts))
        if workload == "W4":
            rows.append(("W4b", "W4", worker_counts))
    for workload, source, worker_counts in rows:
        m = metric[workload]
        for w in worker_counts:
            vals = {l: median_of(results.get((source, w, l), []), m) for l in libs}
            cells = [("-" if vals[l] is None else (f"{vals[l]:.3f}" if workload in _TIMES else f"{vals[l]:,.0f}")) for l in libs]
            ratios = []
            for l in libs[1:]:
                a, b = vals["grainlike"], vals[l]
                if a is None or b is None or a == 0 or b == 0:
                    ratios.append("-")
                elif workload in _TIMES:
                    ratios.append(f"{a / b:.2f}x time")
                else:
                    ratios.append(f"{a / b:.2f}x")
            firsts = " / ".join(
                "-" if median_of(results.get((source, w, l), []), "first_batch_s") is None
                else f"{median_of(results.get((source, w, l), []), 'first_batch_s'):.2f}" for l in libs
            )
            peaks = " / ".join(
                "-" if median_of(results.get((source, w, l), []), "peak_mb") is None
                else f"{median_of(results.get((source, w, l), []), 'peak_mb'):.0f}" for l in libs
            )
            lines.append(f"| {workload} | {w} | " + " | ".join(cells) + " | " + " | ".join(ratios) + f" | {firsts} | {peaks} |")
    lines.append("")
    for workload, _, _ in rows:
        lines.append(f"- {workload}: {DESCRIPTIONS[workload]}")
    if floor and "error" not in floor:
        lines.append(
            f"- floors: ArrayRecord batched read {floor['arrayrecord_read_per_s']:,.0f} records/s; "
            f"decode+resize+crop {floor['decode_per_core_per_s']:,.0f} images/s on one core (x{os.cpu_count()} cores = {floor['decode_per_core_per_s'] * (os.cpu_count() or 1):,.0f}); "
            f"memcpy {floor['memcpy_mb_per_s']:,.0f} MB/s"
        )
        if "decode_parallel_per_s" in floor:
            lines.append(
                f"- the same per-image work in {floor['decode_parallel_processes']} processes at once: "
                f"{floor['decode_parallel_per_s']:,.0f} images/s together (the ceiling for that many workers)"
            )
    cpu_rows = [
        (workload, w, {l: median_of(results.get((workload, w, l), []), "consumer_cpu_ms_per_batch") for l in libs})
        for workload, worker_counts, _ in plan for w in worker_counts if workload in _STEADY and w
    ]
    for workload, w, vals in cpu_rows:
        lines.append(
            f"- {workload} W={w}: the calling process's CPU per delivered batch (ms): "
            + ", ".join(f"{l} {'-' if v is None else f'{v:.3f}'}" for l, v in vals.items())
        )
    errors = [(k, r["error"]) for k, rs in results.items() for r in rs if "error" in r]
    for k, e in errors[:10]:
        lines.append(f"- error in {k}: {e}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
