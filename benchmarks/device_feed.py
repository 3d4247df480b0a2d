"""W12: a loader feeding a jitted training step on the default JAX device (the GPU on a GPU host).

The W2 pipeline (JPEG decode + resize + normalise, random crop + flip, batches of
64) feeds a small convolutional network's training step (bfloat16 convolutions,
SGD), jitted on JAX's default device: each batch is put on the device and the
step runs on it. The device's own rate is measured in the same run (the same
step on one batch already on the device, repeated), so the table says whether
the loader or the device is the limit. Each measurement is a fresh process.

    tools/bench --only W12 --workers 4,8,15
    .venv/bin/python -m benchmarks.device_feed --workers 8 --libs grainlike,torch,grain
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

BATCH = 64


def _train_step():
    """``(init params, jitted step(params, images, labels) -> params)``."""
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    params = {
        "c1": jax.random.normal(k1, (3, 3, 3, 32), jnp.float32) * 0.1,
        "c2": jax.random.normal(k2, (3, 3, 32, 64), jnp.float32) * 0.05,
        "d": jax.random.normal(k3, (64, 10), jnp.float32) * 0.05,
    }

    def loss(p, x, y):
        x = x.astype(jnp.bfloat16)
        dn = ("NHWC", "HWIO", "NHWC")
        h = jax.lax.conv_general_dilated(x, p["c1"].astype(jnp.bfloat16), (2, 2), "SAME", dimension_numbers=dn)
        h = jax.nn.relu(h)
        h = jax.lax.conv_general_dilated(h, p["c2"].astype(jnp.bfloat16), (2, 2), "SAME", dimension_numbers=dn)
        h = jax.nn.relu(h).astype(jnp.float32).mean(axis=(1, 2))
        logits = h @ p["d"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))

    @jax.jit
    def step(p, x, y):
        g = jax.grad(loss)(p, x, y)
        return jax.tree.map(lambda a, b: a - 0.01 * b, p, g)

    return params, step


def _arrays(batch) -> tuple:
    """(images, labels) as numpy from any library's batch."""
    import numpy as np

    if isinstance(batch, dict):
        x, y = batch["image"], batch["label"]
    else:
        x, y = batch
    to_np = (lambda a: a.numpy()) if hasattr(x, "numpy") and not isinstance(x, np.ndarray) else np.asarray
    return to_np(x), to_np(y).astype(np.int32)


def measure(lib: str, seconds: float, workers: int) -> dict:
    """Runs in the child: images/s through the training step, or the device alone (``lib == "device"``)."""
    import jax
    import numpy as np

    params, step = _train_step()
    device = str(jax.devices()[0].device_kind)
    if lib == "device":
        rng = np.random.default_rng(0)
        x = jax.device_put(rng.random((BATCH, 56, 56, 3), dtype=np.float32))
        y = jax.device_put(rng.integers(0, 10, BATCH).astype(np.int32))
        params = jax.block_until_ready(step(params, x, y))
        n = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(20):
                params = step(params, x, y)
            jax.block_until_ready(params)
            n += 20 * BATCH
        return {"images_per_s": n / (time.perf_counter() - t0), "device": device}
    from benchmarks import bench

    loader = bench._loader(lib, "W2", workers, BATCH)
    it = iter(loader)
    t0 = time.perf_counter()
    for _ in range(3):  # workers started, step compiled
        x, y = _arrays(next(it))
        params = step(params, jax.device_put(x), jax.device_put(y))
    jax.block_until_ready(params)
    first = time.perf_counter() - t0
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        x, y = _arrays(next(it))
        params = step(params, jax.device_put(x), jax.device_put(y))
        n += len(x)
    jax.block_until_ready(params)
    elapsed = time.perf_counter() - t0
    close = getattr(it, "close", None)
    if close is not None:
        close()
    return {"images_per_s": n / elapsed, "first_s": first, "device": device}


def run(reps: int, seconds: float, libs: list[str], workers: list[int] | None = None) -> str:
    """Measures the device alone and each library at each worker count, interleaved."""
    workers = workers or [2]
    cells = [("device", 0)] + [(lib, w) for w in workers for lib in libs]
    results: dict = {c: [] for c in cells}
    for _ in range(reps):
        for lib, w in cells:
            results[(lib, w)].append(run_child("benchmarks.device_feed", [lib, seconds, w], timeout=300))
    device = next((r["device"] for rs in results.values() for r in rs if "device" in r), "?")
    alone = statistics.median([r["images_per_s"] for r in results[("device", 0)] if "images_per_s" in r] or [0])
    lines = [
        f"### W12: W2 pipeline feeding a jitted bf16 conv training step on {device} (batch {BATCH})",
        "",
        f"The training step alone on one batch already on the device: **{alone:,.0f} images/s**.",
        "",
        "| workers | " + " | ".join(libs) + " | " + " | ".join(f"grainlike/{l}" for l in libs if l != "grainlike") + " |",
        "|---|" + "---|" * (2 * len(libs) - 1),
    ]
    for w in workers:
        vals = {}
        for lib in libs:
            ok = [r["images_per_s"] for r in results[(lib, w)] if "images_per_s" in r]
            vals[lib] = statistics.median(ok) if ok else None
        cells_txt = [f"{vals[l]:,.0f}" if vals[l] else f"failed: {results[(l, w)][-1].get('error', '?')}" for l in libs]
        ratio_txt = [
            f"{vals['grainlike'] / vals[l]:.2f}x" if vals.get("grainlike") and vals[l] else "-"
            for l in libs if l != "grainlike"
        ]
        lines.append(f"| {w} | " + " | ".join(cells_txt + ratio_txt) + " |")
    return "\n".join(lines)


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--workers", default="2")
    parser.add_argument("--libs", default="grainlike,torch,grain")
    parser.add_argument("--child", nargs=3, metavar=("LIB", "SECONDS", "WORKERS"))
    args = parser.parse_args(argv)
    if args.child:
        lib, seconds, workers = args.child
        print(json.dumps(measure(lib, float(seconds), int(workers))))
        return 0
    print(run(args.reps, args.seconds, args.libs.split(","), [int(w) for w in args.workers.split(",")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
