"""Soak run: many epochs of the images pipeline, watching memory and shared memory.

Iterates ``--epochs`` epochs of W2 (JPEG 96x96 in an ArrayRecord file -> OpenCV
decode + resize + normalise, random crop + flip, ``Batch(64)``, 2 workers) while a
thread samples, every ``--interval`` seconds, the resident memory (RSS) of this
process and all its children, the number of grainlike segment names in /dev/shm
and the number of segments the consumer has mapped (names are unlinked as soon as
the consumer opens a segment, so the mapped count is the one that grows on a leak).
Prints the RSS slope after the first epoch (a leak shows as a steady positive
slope), and the largest segment count (it must stay bounded by workers x buffer).

    python benchmarks/soak.py                       # 20 epochs of 20k images
    python benchmarks/soak.py --images 4000 --epochs 5
    python benchmarks/soak.py --json soak.json      # also write the samples
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import psutil  # noqa: E402


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc] + proc.children(recursive=True):
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def _segments() -> int:
    try:
        return sum(1 for n in os.listdir("/dev/shm") if n.startswith("grainlike_"))
    except OSError:
        return 0


def _mapped(pid: int) -> int:
    """Distinct grainlike segments mapped by ``pid`` (their names may be unlinked)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return len({line.split()[-2] if line.rstrip().endswith("(deleted)") else line.split()[-1]
                        for line in f if "/dev/shm/grainlike_" in line})
    except OSError:
        return 0


class Sampler(threading.Thread):
    """Samples (seconds, epochs done, RSS bytes, segment names, mapped) until stopped."""

    def __init__(self, progress, interval: float):
        super().__init__(name="soak-sampler", daemon=True)
        self.progress = progress
        self.interval = interval
        self.samples: list[tuple[float, float, int, int, int]] = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        me = psutil.Process()
        while not self.stop.is_set():
            self.samples.append(
                (time.monotonic() - self.t0, self.progress(), _tree_rss(me), _segments(), _mapped(me.pid))
            )
            self.stop.wait(self.interval)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--images", type=int, default=None, help="dataset size (default 20000)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--json", default=None, help="write the samples to this file")
    args = parser.parse_args()

    from benchmarks import workloads

    if args.images is not None:
        workloads.N_IMAGES = args.images  # images_path() names and writes the file by it
    path = workloads.images_path()

    import grainlike as grain
    from benchmarks.grainlike_ops import CropFlip, DecodeResize

    source = grain.ArrayRecordDataSource(path)
    n = len(source)
    loader = grain.DataLoader(
        data_source=source,
        sampler=grain.IndexSampler(n, grain.NoSharding(), shuffle=True, num_epochs=args.epochs, seed=0),
        operations=[DecodeResize(), CropFlip(), grain.Batch(args.batch)],
        worker_count=args.workers,
    )
    seen = [0]
    sampler = Sampler(lambda: seen[0] / n, args.interval)
    print(f"soak: {n} images x {args.epochs} epochs, {args.workers} workers, Batch({args.batch})", flush=True)
    sampler.start()
    start = time.monotonic()
    epoch_marks = []
    with iter(loader) as it:
        for batch in it:
            before = seen[0] // n
            seen[0] += len(batch["label"])
            if seen[0] // n > before:
                epoch_marks.append(time.monotonic() - start)
                done = seen[0] / n
                s = sampler.samples[-1] if sampler.samples else (0, 0, 0, 0, 0)
                print(
                    f"  epoch {done:5.2f}: {time.monotonic() - start:7.1f} s, "
                    f"tree RSS {s[2] / 2**20:7.1f} MB, segments in /dev/shm {s[3]}, "
                    f"mapped by the consumer {s[4]}",
                    flush=True,
                )
            del batch
    elapsed = time.monotonic() - start
    loop_end = time.monotonic() - sampler.t0
    time.sleep(args.interval)  # one sample after close
    sampler.stop.set()
    sampler.join()

    samples = sampler.samples
    # While iterating, after the first epoch (not the sample after close, when the
    # workers have exited).
    after = [(p, r) for t, p, r, _, _ in samples if p >= 1.0 and t <= loop_end]
    if len(after) >= 2:
        x = np.array([p for p, _ in after])
        y = np.array([r for _, r in after]) / 2**20
        slope = float(np.polyfit(x, y, 1)[0]) if np.ptp(x) > 0 else float("nan")
    else:
        slope = float("nan")
    rss = [r for _, _, r, _, _ in samples]
    result = {
        "images": n,
        "epochs": args.epochs,
        "seconds": round(elapsed, 1),
        "images_per_s": round(seen[0] / elapsed, 1),
        "rss_slope_mb_per_epoch_after_first": round(slope, 2),
        "rss_first_epoch_end_mb": round(
            next((r for _, p, r, _, _ in samples if p >= 1.0), rss[-1]) / 2**20, 1
        ),
        "rss_max_mb": round(max(rss) / 2**20, 1),
        "segments_max": max(s[3] for s in samples),
        "segments_after_close": samples[-1][3],
        "mapped_segments_max": max(s[4] for s in samples),
        "mapped_segments_after_close": samples[-1][4],
        "samples": len(samples),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**result, "series": samples}, f)


if __name__ == "__main__":
    main()
