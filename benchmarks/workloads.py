"""Pipelines measured by ``tools/bench``, written once per library.

Transforms live in this importable module so that every library's worker
processes (grain's and torch's pickle by reference) can load them.
"""

from __future__ import annotations

import os
import struct
import tempfile
from typing import Callable

import numpy as np

CACHE = os.environ.get("GRAINLIKE_BENCH_DIR", os.path.join(tempfile.gettempdir(), "grainlike-bench"))
N_SMALL = 1_000_000
N_IMAGES = 20_000
N_BIG = 4_096
BIG_FLOATS = 65_536  # 256 KiB of float32


# -- data ----------------------------------------------------------------------------


def cached_file(name: str, write: Callable[[str], None]) -> str:
    """The path of ``CACHE/name``, written by ``write(path)`` if it does not exist yet.

    ``write`` writes a temporary name in the same directory that is then renamed
    into place, so no run reads a half-written file of another.
    """
    path = os.path.join(CACHE, name)
    if os.path.exists(path):
        return path
    os.makedirs(CACHE, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    write(tmp)
    os.replace(tmp, path)
    return path


def images_path() -> str:
    """An ArrayRecord file of JPEG-encoded 96x96 RGB images with labels (made once)."""
    return cached_file(f"images-{N_IMAGES}.array_record", _write_images)


def _write_images(path: str) -> None:
    import cv2
    from array_record.python.array_record_module import ArrayRecordWriter

    rng = np.random.default_rng(0)
    writer = ArrayRecordWriter(path, "group_size:1")
    base = rng.integers(0, 256, (96, 96, 3), dtype=np.uint8)
    for i in range(N_IMAGES):
        # Smooth-ish images so the JPEGs have a realistic size (~5-8 KB).
        img = np.roll(base, i % 96, axis=1) // 2 + rng.integers(0, 64, (96, 96, 3), dtype=np.uint8)
        ok, jpg = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])
        assert ok
        writer.write(struct.pack("<i", i % 10) + jpg.tobytes())
    writer.close()


class BigSource:
    """256 KiB float32 records made on read (the cost of a memset)."""

    # Local and CPU-bound: grainlike reads a source that says so in the calling
    # thread (without it, a source of a type grainlike does not know gets
    # grain's 16 read threads). grain and torch ignore the attribute.
    waits = False

    def __len__(self) -> int:
        return N_BIG

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(BIG_FLOATS, i, np.float32)

    def __repr__(self) -> str:
        return f"BigSource(n={N_BIG})"


# -- per-record work, shared by every library ------------------------------------------


def decode_resize_normalise(record: bytes) -> dict:
    import cv2

    label = struct.unpack_from("<i", record)[0]
    img = cv2.imdecode(np.frombuffer(record, np.uint8, offset=4), cv2.IMREAD_COLOR)
    img = cv2.resize(img, (64, 64), interpolation=cv2.INTER_LINEAR)
    img = (img.astype(np.float32) - 127.5) * (1 / 127.5)
    return {"image": img, "label": np.int32(label)}


def crop_flip(x: dict, rng: np.random.Generator) -> dict:
    top, left = rng.integers(0, 9, size=2)
    img = x["image"][top : top + 56, left : left + 56]
    if rng.random() < 0.5:
        img = img[:, ::-1]
    return {"image": np.ascontiguousarray(img), "label": x["label"]}


# -- pipelines written with grain's Dataset API ----------------------------------------


def maxtext_style(lib, ops, workers: int, batch: int, host: int = 0, host_count: int = 1):
    """W6: the Dataset API pipeline MaxText builds, for ``lib`` (grain.python or grainlike).

    Shuffled and repeated as a MapDataset, sharded by host with a slice, then an
    IterDataset (where grain allows ``mp_prefetch`` to slice it per worker):
    decode, random crop and flip, batch, worker processes.
    """
    ds = lib.MapDataset.source(lib.ArrayRecordDataSource(images_path()))
    ds = ds.shuffle(seed=0).repeat()[host::host_count]
    ds = ds.to_iter_dataset()
    ds = ds.map(ops.DecodeResize()).random_map(ops.CropFlip(), seed=0).batch(batch)
    return ds.mp_prefetch(lib.MultiprocessingOptions(num_workers=workers))
