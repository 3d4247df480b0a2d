"""W10: reading ArrayRecord and Parquet files from an S3 server vs from local disk.

The same records (20k of 1 KiB, in 4 shards) are read by a grainlike DataLoader
(sequential keys, ``Batch(64)``, 0 or 2 workers) from local files and from
``s3://`` URLs served by moto's S3 server started on localhost: ArrayRecord
through the local cache (cold: the cache is empty, so the epoch includes copying
the shards; warm: already cached), Parquet by ranged reads with read-ahead (no
cache). Each configuration runs in a fresh subprocess, interleaved over reps;
the figures are the seconds to build the source (importing s3fs, reading each
file's size and footer, and for a cold ArrayRecord cache copying the shards) and
the records/s of one epoch after that (worker start included), with the ratio to
local files. moto is a
single Python process, far slower than a real object store: the remote figures
show the overhead of the remote path on one machine, not the speed of S3.

    tools/bench --only W10
    .venv/bin/python -m benchmarks.remote --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.child import run_child  # noqa: E402

SHARDS = 4
PER_SHARD = 5000
RECORD_BYTES = 1024
BUCKET = "bench-data"
# (format, where, workers)
CONFIGS = [
    (fmt, where, w)
    for fmt, wheres in (("array_record", ("local", "s3-cold", "s3-warm")), ("parquet", ("local", "s3")))
    for where in wheres
    for w in (0, 2)
]


def _write(directory: str) -> dict:
    """The shards, written once: ``{object key: local path}``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from array_record.python.array_record_module import ArrayRecordWriter

    rng = np.random.default_rng(0)
    files = {}
    for s in range(SHARDS):
        payload = rng.integers(0, 255, (PER_SHARD, RECORD_BYTES), dtype=np.uint8)
        path = os.path.join(directory, f"train-{s:05d}-of-{SHARDS:05d}.array_record")
        writer = ArrayRecordWriter(path, "group_size:1")
        for row in payload:
            writer.write(row.tobytes())
        writer.close()
        files[f"ar/{os.path.basename(path)}"] = path
        path = os.path.join(directory, f"part-{s}.parquet")
        pq.write_table(pa.table({"x": [row.tobytes() for row in payload]}), path, row_group_size=500)
        files[f"pq/{os.path.basename(path)}"] = path
    return files


def measure(fmt: str, where: str, workers: int, endpoint: str, data_dir: str, cache_dir: str) -> dict:
    """Runs in the child: one epoch through the DataLoader; records/s."""
    import grainlike as gl
    from grainlike.sources.formats.remote_files import RemoteOptions

    names = sorted(n for n in os.listdir(data_dir) if n.endswith("." + fmt))
    if where == "local":
        paths = [os.path.join(data_dir, n) for n in names]
    else:
        prefix = "ar" if fmt == "array_record" else "pq"
        paths = [f"s3://{BUCKET}/{prefix}/{n}" for n in names]
    storage = {
        "endpoint_url": endpoint, "key": "bench", "secret": "bench",
        "client_kwargs": {"region_name": "us-east-1"},
    }
    start = time.perf_counter()
    if fmt == "array_record":
        options = RemoteOptions(storage_options=storage, cache_dir=cache_dir)
        source = gl.ArrayRecordDataSource(paths, remote_options=options)
    else:
        source = gl.ParquetDataSource(paths, remote_options=RemoteOptions(storage_options=storage))
    loader = gl.DataLoader(
        data_source=source,
        sampler=gl.IndexSampler(len(source), gl.NoSharding(), shuffle=False, num_epochs=1),
        operations=[gl.Batch(64)],
        worker_count=workers,
    )
    built = time.perf_counter()
    n = 0
    for batch in loader:
        n += len(batch) if fmt == "array_record" else len(batch["x"])
    end = time.perf_counter()
    return {"records_per_s": n / (end - built), "records": n, "build_s": built - start}


# The child talks to the local server only: no AWS configuration of this machine.
_CHILD_ENV = {
    "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true",
}


def run(reps: int, seconds: float, libs: list) -> str:
    """Measures every configuration ``reps`` times; returns a markdown section."""
    del seconds, libs  # One epoch per run; grainlike only (grain reads no s3:// paths).
    from tests.sources.s3_server import LocalS3Server

    work = tempfile.mkdtemp(prefix="grainlike-bench-remote-")
    server = LocalS3Server()
    results: dict = {}
    try:
        files = _write(work)
        server.start()
        server.upload(BUCKET, files)
        for rep in range(reps):
            for fmt, where, workers in CONFIGS:
                cache = os.path.join(work, "cache")
                if where == "s3-cold":
                    shutil.rmtree(cache, ignore_errors=True)
                r = run_child("benchmarks.remote", [fmt, where, workers, server.endpoint_url, work, cache], env=_CHILD_ENV)
                results.setdefault((fmt, where, workers), []).append(r)
                print(f"[{rep + 1}/{reps}] W10 {fmt} {where} W={workers}: {r}", file=sys.stderr)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    lines = [
        "## W10: remote files (s3:// on a local moto server) vs local files",
        "",
        f"{SHARDS * PER_SHARD} records of {RECORD_BYTES} B in {SHARDS} shards, DataLoader, "
        f"Batch(64), one epoch per fresh process, median of {reps} (`tools/bench --only W10`). moto is one Python "
        "process: these figures are the remote path's overhead, not S3's speed.",
        "",
        "| format | read from | workers | build source (s) | epoch records/s | vs local |",
        "|---|---|---|---|---|---|",
    ]
    for fmt, where, workers in CONFIGS:
        runs = [r["records_per_s"] for r in results.get((fmt, where, workers), []) if "records_per_s" in r]
        local = [r["records_per_s"] for r in results.get((fmt, "local", workers), []) if "records_per_s" in r]
        if not runs:
            errors = [r.get("error") for r in results.get((fmt, where, workers), [])]
            lines.append(f"| {fmt} | {where} | {workers} | error: {errors[:1]} | | |")
            continue
        value = statistics.median(runs)
        build = statistics.median(r["build_s"] for r in results[(fmt, where, workers)] if "build_s" in r)
        ratio = f"{value / statistics.median(local):.2f}x" if local else ""
        lines.append(f"| {fmt} | {where} | {workers} | {build:.2f} | {value:,.0f} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--child", nargs=6)
    args = parser.parse_args()
    if args.child:
        fmt, where, workers, endpoint, data_dir, cache_dir = args.child
        print(json.dumps(measure(fmt, where, int(workers), endpoint, data_dir, cache_dir)))
        return
    print(run(args.reps, 0.0, ["grainlike"]))


if __name__ == "__main__":
    main()
