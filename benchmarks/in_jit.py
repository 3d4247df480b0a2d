"""W9: batches drawn inside ``jax.jit`` / ``lax.scan``, grainlike beside JaxSGMC 0.1.5.

10k records ``{"x": float32[16], "y": int32}`` held in numpy, batches of 32,
shuffled in epochs, a device cache of 100 batches (one host callback per 100
steps). The jitted program is a ``lax.scan`` of 2000 steps that draws a batch
and sums it; the figure is batches per second over repeated calls after the
first (compilation). Each measurement is a fresh subprocess; the runs alternate.

- ``grainlike``: ``grainlike.reference_data(arrays, cache_size=100, batch_size=32)``,
  ``init(shuffle=True)``, ``next(state)``;
- ``grainlike W=2``: the same with 2 worker processes reading the records;
- ``grainlike InJitIterator``: ``InJitIterator(iter(loader), batches_per_call=100).scan``;
- ``jax-sgmc``: ``data.random_reference_data(NumpyDataLoader(...), 100, 32)``,
  ``init_fn(shuffle=True)``, ``batch_fn(state)`` (JaxSGMC's own code, the
  ``bench`` extra installs it).

    tools/bench --only W9
    .venv/bin/python -m benchmarks.in_jit --reps 3
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

N, BATCH, CACHE, STEPS = 10_000, 32, 100, 2000
VARIANTS = ("grainlike", "grainlike W=2", "grainlike InJitIterator", "jax-sgmc")


def _arrays() -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    return {"x": rng.random((N, 16), dtype=np.float32), "y": rng.integers(0, 10, N).astype(np.int32)}


def _feed(variant: str):
    """``(state, next_fn, close)``: next_fn(state) -> (state, batch) inside jit."""
    arrays = _arrays()
    if variant == "jax-sgmc":
        from jax_sgmc import data
        from jax_sgmc.data.numpy_loader import NumpyDataLoader

        init_fn, batch_fn, release = data.random_reference_data(NumpyDataLoader(**arrays), CACHE, BATCH)
        return init_fn(shuffle=True), batch_fn, release
    import grainlike as grain

    if variant == "grainlike InJitIterator":
        from grainlike.jax.jit_batches import ArraysSource

        loader = grain.DataLoader(
            data_source=ArraysSource(arrays),
            sampler=grain.IndexSampler(N, grain.NoSharding(), shuffle=True, num_epochs=None, seed=0),
            operations=[grain.Batch(BATCH)],
        )
        feed = grain.InJitIterator(iter(loader), batches_per_call=CACHE)
        return feed, None, feed.close
    workers = 2 if variant == "grainlike W=2" else 0
    data = grain.reference_data(arrays, cache_size=CACHE, batch_size=BATCH, worker_count=workers)
    state = data.init(shuffle=True)
    return state, lambda s: data.next(s, information=False), data.release


def measure(variant: str, seconds: float) -> dict:
    """Runs in the child: batches per second drawn inside a jitted scan."""
    import jax
    import jax.numpy as jnp

    state, next_fn, close = _feed(variant)

    def step(c, batch):
        return c + jnp.sum(batch["x"]) + jnp.sum(batch["y"]), None

    if next_fn is None:  # InJitIterator: the feed keeps its own position
        feed = state
        run = jax.jit(lambda c: feed.scan(step, c, num_steps=STEPS))
        carry = jnp.float32(0)
        call = lambda: run(carry)[0]  # noqa: E731
    else:
        def body(c, _):
            s, total = c
            s, batch = next_fn(s)
            total, _ = step(total, batch)
            return (s, total), None

        run = jax.jit(lambda c: jax.lax.scan(body, c, None, length=STEPS)[0])
        holder = [(state, jnp.float32(0))]

        def call():
            holder[0] = run(holder[0])
            return holder[0]

    t0 = time.perf_counter()
    jax.block_until_ready(call())
    first = time.perf_counter() - t0
    batches = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        jax.block_until_ready(call())
        batches += STEPS
    elapsed = time.perf_counter() - t0
    close()
    return {"batches_per_s": batches / elapsed, "first_call_s": first}


def _have_jax_sgmc() -> bool:
    try:
        import jax_sgmc  # noqa: F401
    except ImportError:
        return False
    return True


def run(reps: int, seconds: float, libs: list[str]) -> str:
    """Measures each variant ``reps`` times, interleaved; returns a markdown section."""
    variants = [v for v in VARIANTS if v != "jax-sgmc" or _have_jax_sgmc()]
    results: dict = {v: [] for v in variants}
    errors: dict = {}
    for _ in range(reps):
        for v in variants:
            r = run_child("benchmarks.in_jit", [v, seconds])
            if "error" in r:
                errors[v] = r["error"]
            else:
                results[v].append(r)
    lines = [
        f"### W9: batches drawn inside jit (batch {BATCH}, cache {CACHE}, scan of {STEPS} steps)",
        "",
        "| variant | batches/s | vs jax-sgmc | first call (s) |",
        "|---|---|---|---|",
    ]
    ref = statistics.median([r["batches_per_s"] for r in results.get("jax-sgmc", [])] or [0]) or None
    for v in variants:
        if not results[v]:
            lines.append(f"| {v} | failed: {errors.get(v, '?')} | | |")
            continue
        bps = statistics.median(r["batches_per_s"] for r in results[v])
        first = statistics.median(r["first_call_s"] for r in results[v])
        ratio = f"{bps / ref:.2f}x" if ref else "-"
        lines.append(f"| {v} | {bps:,.0f} | {ratio} | {first:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "SECONDS"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child[0], float(args.child[1]))))
        return 0
    print(run(args.reps, args.seconds, ["grainlike"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
