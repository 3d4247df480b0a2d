"""W8: how long ``CheckpointManager.save()`` blocks the training loop, with and without the data item.

An asynchronous Orbax ``CheckpointManager`` saves a ~10 MB model pytree
(``StandardSave``), alone and beside a DataLoader iterator (``CheckpointSave``),
alternating, in one process: grainlike's handler, or grain 0.2.18's. Each
configuration runs in a fresh subprocess, interleaved with the others
(grainlike, grain, grainlike, ...), on an idle machine and with every core kept
busy by spinning processes (as data workers keep them in training). The time
measured is the call to ``save()`` only: the previous save is waited for before
the clock starts, so it is the time the loop is blocked, not the write.

"empty" is an item whose handler writes nothing: what any item costs inside
Orbax.

    tools/bench --only W8
    .venv/bin/python -m benchmarks.checkpoint_save --reps 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.child import run_child  # noqa: E402

# (data item's handler, worker count)
CONFIGS = [
    ("empty", 0),
    ("grainlike", 0),
    ("grain", 0),
    ("grainlike", 2),
    ("grain", 2),
]
LOADS = ("idle", "busy")
MODEL_MB = 10
NUM_RECORDS = 10_000


def _empty_item_args():
    """Args of an item whose asynchronous handler writes nothing and returns no future."""
    import dataclasses

    import orbax.checkpoint as ocp

    class EmptyHandler(ocp.AsyncCheckpointHandler):
        async def async_save(self, directory, args=None):
            return []

        def save(self, directory, args=None):
            pass

        def restore(self, directory, args=None):
            return None

    @ocp.args.register_with_handler(EmptyHandler, for_save=True)
    @dataclasses.dataclass
    class EmptySave(ocp.args.CheckpointArgs):
        item: object

    @ocp.args.register_with_handler(EmptyHandler, for_restore=True)
    @dataclasses.dataclass
    class EmptyRestore(ocp.args.CheckpointArgs):  # Orbax wants both
        item: object

    return EmptySave


@contextlib.contextmanager
def _busy(load: str):
    """With ``load == "busy"``, one spinning process per core while the block runs."""
    spinners = []
    if load == "busy":
        for _ in range(os.cpu_count() or 1):
            spinners.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
    try:
        yield
    finally:
        for p in spinners:  # only the processes started here
            p.send_signal(signal.SIGKILL)
            p.wait()


def _iterator(lib_name: str, workers: int):
    if lib_name == "empty":
        from benchmarks import grainlike_ops as ops

        save = _empty_item_args()
    elif lib_name == "grain":
        from benchmarks import grain_ops as ops

        import grain.checkpoint

        save = grain.checkpoint.CheckpointSave
    else:
        from benchmarks import grainlike_ops as ops

        import grainlike.checkpoint

        save = grainlike.checkpoint.CheckpointSave
    lib = ops.lib
    loader = lib.DataLoader(
        data_source=lib.RangeDataSource(0, NUM_RECORDS, 1),
        sampler=lib.IndexSampler(NUM_RECORDS, lib.NoSharding(), shuffle=True, num_epochs=1, seed=0),
        operations=[ops.Identity(), lib.Batch(32)],
        worker_count=workers,
    )
    return iter(loader), save


def measure(lib_name: str, workers: int, pairs: int, load: str) -> dict:
    """Runs in the child: ``pairs`` saves of the model alone and of model + data, alternating.

    Alternating in one process compares the two under the same load; the
    difference of each pair is the data item's cost.
    """
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    n = MODEL_MB * 2**20 // 4 // 2
    model = {"w": jnp.arange(n, dtype=jnp.float32), "b": jnp.ones(n, jnp.float32)}
    it, save_args = _iterator(lib_name, workers)
    alone, with_data = [], []
    with tempfile.TemporaryDirectory() as tmp, _busy(load):
        options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True, max_to_keep=2)
        with ocp.CheckpointManager(os.path.join(tmp, "ckpt"), options=options) as mngr:
            for step in range(2 * pairs + 4):  # four warm-up saves: tracing, first-use imports
                for _ in range(3):
                    next(it)
                model = {"w": model["w"] + 1, "b": model["b"]}
                model["w"].block_until_ready()
                items = {"model": ocp.args.StandardSave(model)}
                if step % 2:
                    items["data"] = save_args(it)
                mngr.wait_until_finished()
                t0 = time.perf_counter()
                mngr.save(step, args=ocp.args.Composite(**items))
                elapsed = (time.perf_counter() - t0) * 1e3
                if step >= 4:
                    (with_data if step % 2 else alone).append(elapsed)
            mngr.wait_until_finished()
    if hasattr(it, "close"):  # grain's DataLoader iterator has no close()
        it.close()
    def p90(values):
        return statistics.quantiles(values, n=10)[-1]

    return {
        "alone_ms": statistics.median(alone),
        "with_data_ms": statistics.median(with_data),
        "diff_ms": statistics.median(b - a for a, b in zip(alone, with_data)),
        "alone_p90_ms": p90(alone),
        "with_data_p90_ms": p90(with_data),
    }


def run(reps: int, seconds: float, libs: list[str]) -> str:
    """Measures every configuration ``reps`` times, interleaved; returns a markdown section."""
    pairs = max(10, min(40, int(seconds * 5)))
    configs = [c for c in CONFIGS if c[0] in libs + ["empty"]]
    results: dict = {}
    for rep in range(reps):
        for load in LOADS:
            for lib_name, workers in configs:
                r = run_child("benchmarks.checkpoint_save", [lib_name, str(workers), str(pairs), load])
                results.setdefault((load, lib_name, workers), []).append(r)
                print(f"[{rep + 1}/{reps}] W8 {load} {lib_name} W={workers}: {r}", file=sys.stderr)

    lines = [
        "### W8: blocking time of an asynchronous `CheckpointManager.save()` "
        f"(~{MODEL_MB} MB model, with and without a DataLoader iterator)",
        "",
        f"{reps} repetition(s), fresh process per run, {pairs} saves of the model alone "
        f"alternating with {pairs} of model + iterator; milliseconds the call to `save()` "
        "took: medians and 90th percentiles over the saves (medians over the runs); the "
        "difference is the median of the paired differences. busy: one spinning process "
        "per core.",
        "",
        "| data item's handler | W | cores | model alone | model + data | difference "
        "| p90 model alone | p90 model + data |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = ("alone_ms", "with_data_ms", "diff_ms", "alone_p90_ms", "with_data_p90_ms")
    for load in LOADS:
        for lib_name, workers in configs:
            rs = [r for r in results[(load, lib_name, workers)] if "diff_ms" in r]
            if not rs:
                error = results[(load, lib_name, workers)][-1]["error"]
                lines.append(f"| {lib_name} | {workers} | {load} | error: {error} | | | | |")
                continue
            cells = [statistics.median(r[k] for r in rs) for k in keys]
            lines.append(
                f"| {lib_name} | {workers} | {load} | {cells[0]:.2f} | {cells[1]:.2f} | "
                f"{cells[2]:+.2f} | {cells[3]:.2f} | {cells[4]:.2f} |"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="5 pairs of saves per second, 10 to 40")
    parser.add_argument("--libs", default="grainlike,grain")
    parser.add_argument("--child", nargs=4, metavar=("HANDLER", "WORKERS", "PAIRS", "LOAD"))
    args = parser.parse_args(argv)
    if args.child:
        lib_name, workers, pairs, load = args.child
        print(json.dumps(measure(lib_name, int(workers), int(pairs), load)))
        return 0
    print(run(args.reps, args.seconds, args.libs.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
