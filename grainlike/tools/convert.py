"""``grainlike-convert``: write datasets as ArrayRecord files for fast random access.

Output: ``PREFIX-00000-of-0000N.array_record`` ... (records split into N
contiguous shards, written with ``group_size:1`` for random reads) plus
``PREFIX.json`` describing them. Each record is one example in the format of
``grainlike.formats`` (a small JSON header and raw bytes; images stay encoded).
Inputs: a folder of images with one sub-folder per class (``images``,
``convert_image_folder``), ``.npy`` / ``.npz`` arrays (``arrays``,
``convert_arrays``), a TFDS split (``tfds``, ``convert_tfds``) or any source
(``source MODULE:NAME``, ``convert_source``). Read them back with::

    import grainlike as grain
    from grainlike.formats import DecodeRecord, list_shards

    source = grain.ArrayRecordDataSource(list_shards(PREFIX))
    operations = [DecodeRecord(), ...]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Optional

import numpy as np

from grainlike.core.errors import add_note
from grainlike.sources.formats.record_codec import IMAGE_SIGNATURES, encode_record
from grainlike.sources.protocol import RandomAccessDataSource, SupportsBatchedRead

__all__ = [
    "IMAGE_EXTENSIONS",
    "convert_arrays",
    "convert_image_folder",
    "convert_source",
    "convert_tfds",
    "main",
    "write_records",
]

FORMAT_NAME = "grainlike-record-v1"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
# Records read per batched read from a source: amortises the per-call cost
# without holding many decoded examples in memory.
_READ_CHUNK = 256
_END = object()


class _WriteProgress:
    """tqdm when installed, else a counter on stderr redrawn at most twice a second."""

    def __init__(self, total: int, desc: str, enabled: bool):
        self._total, self._desc, self._done, self._last = total, desc, 0, 0.0
        self._enabled, self._bar = enabled, None
        if not enabled:
            return
        try:
            from tqdm import tqdm  # pylint: disable=g-import-not-at-top
        except ImportError:
            return
        self._bar = tqdm(total=total, desc=desc, unit=" records", file=sys.stderr, dynamic_ncols=True)

    def update(self, n: int) -> None:
        self._done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._enabled and (time.monotonic() - self._last > 0.5 or self._done == self._total):
            self._last = time.monotonic()
            sys.stderr.write(f"\r{self._desc}: {self._done}/{self._total} records")
            sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _shard_path(prefix: str, index: int, count: int) -> str:
    return f"{prefix}-{index:05d}-of-{count:05d}.array_record"


def _check_output(prefix: str, overwrite: bool) -> None:
    import glob  # pylint: disable=g-import-not-at-top

    directory = os.path.dirname(os.path.abspath(prefix))
    os.makedirs(directory, exist_ok=True)
    existing = sorted(glob.glob(glob.escape(prefix) + "-*-of-*.array_record"))
    if existing and not overwrite:
        raise FileExistsError(
            f"shards with prefix {prefix!r} already exist ({existing[0]}, ...); "
            "pass --overwrite (overwrite=True) to replace them"
        )
    for path in existing:
        os.remove(path)


def write_records(
    records: Iterable[Any],
    num_records: int,
    output_prefix: str,
    num_shards: int = 1,
    *,
    metadata: Optional[dict] = None,
    progress: bool = True,
    overwrite: bool = False,
    encode: Callable[[Any], bytes] = encode_record,
) -> list[str]:
    """Writes ``num_records`` examples into ``num_shards`` ArrayRecord files.

    Shard ``i`` holds records ``[i * n // N, (i + 1) * n // N)``, so reading the
    shards in order gives the records in the order they came. Files are written
    under a temporary name and renamed once complete.

    Args:
      records: the examples (each passed to ``encode``), at least ``num_records``.
      num_records: how many to write.
      output_prefix: path prefix of the output files.
      num_shards: number of files, in ``[1, num_records]``.
      metadata: extra entries for ``PREFIX.json`` (e.g. ``{"classes": [...]}``).
      progress: show a progress bar on stderr.
      overwrite: replace existing shards with this prefix instead of failing.
      encode: example -> bytes; ``grainlike.formats.encode_record`` by default.

    Returns:
      The paths of the shards written, in order.

    Raises:
      ValueError: ``num_shards`` out of range, or fewer records than announced.
      FileExistsError: shards with this prefix exist and ``overwrite`` is False.
      RecordFormatError: an example cannot be encoded (the message names the
        record index and field).
    """
    from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

    output_prefix = os.fspath(output_prefix)
    if num_records <= 0:
        raise ValueError(f"nothing to write: the input has {num_records} records")
    if not 1 <= num_shards <= num_records:
        raise ValueError(f"num_shards must be in [1, {num_records}] (the number of records), got {num_shards}")
    _check_output(output_prefix, overwrite)
    bounds = [i * num_records // num_shards for i in range(num_shards + 1)]
    paths = [_shard_path(output_prefix, i, num_shards) for i in range(num_shards)]
    bar = _WriteProgress(num_records, f"writing {os.path.basename(output_prefix)}", progress)
    iterator = iter(records)
    written: list[str] = []
    index = 0
    try:
        for shard, path in enumerate(paths):
            tmp = path + ".tmp"
            written.append(tmp)
            writer = array_record_module.ArrayRecordWriter(tmp, "group_size:1")
            if not writer.ok():
                raise OSError(f"cannot open {tmp!r} for writing")
            try:
                for _ in range(bounds[shard], bounds[shard + 1]):
                    example = next(iterator, _END)
                    if example is _END:
                        raise ValueError(f"the input ended after {index} records; {num_records} were announced")
                    try:
                        data = encode(example)
                    except Exception as e:
                        add_note(e, f"grainlike-convert: while encoding record {index}")
                        raise
                    writer.write(data)
                    index += 1
                    bar.update(1)
            finally:
                writer.close()
        for tmp, path in zip(written, paths):
            os.replace(tmp, path)
    except BaseException:
        for tmp in written:
            if os.path.exists(tmp):
                os.remove(tmp)
        raise
    finally:
        bar.close()
    info = {
        "format": FORMAT_NAME,
        "num_records": num_records,
        "shards": [os.path.basename(p) for p in paths],
        "records_per_shard": [bounds[i + 1] - bounds[i] for i in range(num_shards)],
        **(metadata or {}),
    }
    with open(output_prefix + ".json", "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    return paths


def _read_source(source: Any) -> Iterator[Any]:
    n = len(source)
    batched = isinstance(source, SupportsBatchedRead)
    for lo in range(0, n, _READ_CHUNK):
        keys = list(range(lo, min(lo + _READ_CHUNK, n)))
        yield from source.__getitems__(keys) if batched else map(source.__getitem__, keys)


def convert_source(
    source: Any,
    output_prefix: str,
    num_shards: int = 1,
    *,
    transform: Optional[Callable[[Any], Any]] = None,
    progress: bool = True,
    overwrite: bool = False,
    metadata: Optional[dict] = None,
) -> list[str]:
    """Writes every record of a random-access source, in key order.

    Args:
      source: anything with ``len`` and ``[key]`` (``__getitems__`` is used
        when present): grainlike sources, TFDS sources, a list of dicts.
      transform: applied to each record before encoding (e.g. to drop fields).
      output_prefix, num_shards, progress, overwrite, metadata: as for ``write_records``.

    Returns:
      The shard paths, in order.
    """
    records: Iterable[Any] = _read_source(source)
    if transform is not None:
        records = map(transform, records)
    meta = {"source": repr(source)[:500], **(metadata or {})}
    return write_records(
        records, len(source), output_prefix, num_shards, metadata=meta, progress=progress, overwrite=overwrite
    )


def _is_image_file(name: str, extensions: Sequence[str]) -> bool:
    return name.lower().endswith(tuple(extensions)) and not name.startswith(".")


def convert_image_folder(
    directory: str,
    output_prefix: str,
    num_shards: int = 1,
    *,
    extensions: Sequence[str] = IMAGE_EXTENSIONS,
    include_paths: bool = False,
    progress: bool = True,
    overwrite: bool = False,
) -> list[str]:
    """Writes a folder of images, one sub-folder per class.

    Classes are the sub-folders of ``directory`` that hold images (searched
    recursively), sorted by name; an image's label is its class's index. Images
    are stored as their file's bytes (not decoded); ``PREFIX.json`` lists the
    classes. Records are ``{"image": bytes, "label": int64}`` (plus ``"path"``,
    relative to ``directory``, with ``include_paths``), class by class, files
    sorted by path: shuffle when reading (``IndexSampler(shuffle=True)``).

    Args:
      directory: the root folder.
      extensions: file name endings counted as images (case-insensitive).
      include_paths: add each image's relative path as field ``"path"``.
      output_prefix, num_shards, progress, overwrite: as for ``write_records``.

    Returns:
      The shard paths, in order.

    Raises:
      FileNotFoundError: ``directory`` is missing or holds no class folder
        with images.
      ValueError: a file with an image extension is not an image (named).
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"image folder {directory!r} does not exist or is not a directory")
    classes, files = [], []
    for name in sorted(os.listdir(directory)):
        root = os.path.join(directory, name)
        if not os.path.isdir(root) or name.startswith("."):
            continue
        found = sorted(
            os.path.join(dirpath, f)
            for dirpath, _, names in os.walk(root)
            for f in names
            if _is_image_file(f, extensions)
        )
        if found:
            files.extend((path, len(classes)) for path in found)
            classes.append(name)
    if not files:
        raise FileNotFoundError(
            f"no images in class sub-folders of {directory!r} (expected {directory}/<class>/<image> "
            f"with one of the endings {', '.join(extensions)})"
        )

    def examples() -> Iterator[dict]:
        for path, label in files:
            with open(path, "rb") as f:
                data = f.read()
            if not data.startswith(tuple(IMAGE_SIGNATURES)):
                raise ValueError(f"{path!r} is not an image: it starts with {data[:8]!r}")
            example = {"image": data, "label": np.int64(label)}
            if include_paths:
                example["path"] = os.path.relpath(path, directory)
            yield example

    counts = np.bincount([label for _, label in files], minlength=len(classes)).tolist()
    metadata = {
        "source": f"image folder {os.path.abspath(directory)}",
        "fields": {"image": "encoded image bytes", "label": "int64 class index"},
        "classes": classes,
        "images_per_class": dict(zip(classes, counts)),
    }
    return write_records(
        examples(), len(files), output_prefix, num_shards, metadata=metadata, progress=progress, overwrite=overwrite
    )


def _load_arrays(paths: Sequence[str]) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    origin: dict[str, str] = {}
    for path in map(os.fspath, paths):
        if not os.path.exists(path):
            raise FileNotFoundError(f"array file {path!r} does not exist")
        if path.endswith(".npz"):
            with np.load(path, allow_pickle=False) as npz:
                loaded = {key: npz[key] for key in npz.files}
        elif path.endswith(".npy"):
            # mmap: rows are read as they are written, not all at once.
            loaded = {os.path.splitext(os.path.basename(path))[0]: np.load(path, mmap_mode="r", allow_pickle=False)}
        else:
            raise ValueError(f"{path!r}: expected a .npy or .npz file")
        for key, array in loaded.items():
            if key in arrays:
                raise ValueError(f"field {key!r} comes from both {origin[key]!r} and {path!r}")
            if array.ndim == 0:
                raise ValueError(f"{path!r}: array {key!r} is 0-d; records are its rows, so it needs a first axis")
            arrays[key], origin[key] = array, path
    if not arrays:
        raise ValueError(f"no arrays in {list(paths)}")
    lengths = {key: len(a) for key, a in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(
            "arrays must have the same number of rows (one record per row); got "
            + ", ".join(f"{k}: {n} (from {origin[k]})" for k, n in lengths.items())
        )
    return arrays


def convert_arrays(
    paths: Sequence[str],
    output_prefix: str,
    num_shards: int = 1,
    *,
    progress: bool = True,
    overwrite: bool = False,
) -> list[str]:
    """Writes the rows of ``.npy`` / ``.npz`` arrays, one record per row.

    Record ``i`` is ``{field: array[i]}`` over every array: an ``.npz``
    contributes its keys, an ``.npy`` file its file name without ``.npy``.

    Args:
      paths: ``.npy`` and ``.npz`` files whose arrays share their first axis.
      output_prefix, num_shards, progress, overwrite: as for ``write_records``.

    Returns:
      The shard paths, in order.

    Raises:
      FileNotFoundError: a file is missing.
      ValueError: other extensions, 0-d arrays, duplicate field names or
        different row counts (the message names the files).
    """
    arrays = _load_arrays(paths)
    n = len(next(iter(arrays.values())))
    examples = ({key: a[i] for key, a in arrays.items()} for i in range(n))
    metadata = {
        "source": "arrays " + ", ".join(os.path.abspath(p) for p in paths),
        "fields": {k: f"array {a.dtype} shape {a.shape[1:]}" for k, a in arrays.items()},
    }
    return write_records(examples, n, output_prefix, num_shards, metadata=metadata, progress=progress, overwrite=overwrite)


def convert_tfds(
    name: str,
    split: str,
    output_prefix: str,
    num_shards: int = 1,
    *,
    data_dir: Optional[str] = None,
    decode_images: bool = False,
    progress: bool = True,
    overwrite: bool = False,
) -> list[str]:
    """Writes a prepared TFDS split.

    Top-level ``Image`` features stay encoded (``bytes``; decode them with
    ``grainlike.vision.Decode(key=...)``) unless ``decode_images``. Other
    features are stored as TFDS decodes them with numpy.

    Args:
      name: TFDS dataset name.
      split: split or split expression (``"train[:10%]"``).
      data_dir: TFDS data directory (TFDS's default when None).
      decode_images: store decoded pixels instead of the encoded image.
      output_prefix, num_shards, progress, overwrite: as for ``write_records``.

    Returns:
      The shard paths, in order.
    """
    from grainlike.sources.tfds import tfds_source  # pylint: disable=g-import-not-at-top

    decoders = None
    if not decode_images:
        import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

        probe = tfds_source(name, split, data_dir=data_dir)
        features = getattr(probe.dataset_info.features, "items", lambda: [])()
        decoders = {k: tfds.decode.SkipDecoding() for k, f in features if isinstance(f, tfds.features.Image)}
        decoders = decoders or None
    source = tfds_source(name, split, data_dir=data_dir, decoders=decoders)
    metadata = {"tfds": {"name": name, "split": split, "images_encoded": not decode_images}}
    try:
        label_names = {
            k: f.names for k, f in source.dataset_info.features.items() if hasattr(f, "names") and f.names
        }
        if label_names:
            metadata["class_names"] = label_names
    except AttributeError:
        pass
    return convert_source(source, output_prefix, num_shards, progress=progress, overwrite=overwrite, metadata=metadata)


def _load_object(spec: str) -> Any:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected MODULE:NAME (e.g. mypkg.data:make_source), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would, for a module next to the user
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "__len__")):
        obj = obj()
    if not isinstance(obj, RandomAccessDataSource):
        raise TypeError(f"{spec} is {type(obj).__name__}, not a source (it needs len() and [key])")
    return obj


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grainlike-convert",
        description="Write a dataset as ArrayRecord files (PREFIX-NNNNN-of-NNNNN.array_record "
        "+ PREFIX.json) in grainlike's record format; read them with "
        "ArrayRecordDataSource(list_shards(PREFIX)) and grainlike.formats.DecodeRecord().",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-o", "--output", required=True, metavar="PREFIX", help="output path prefix")
    common.add_argument("-n", "--shards", type=int, default=1, metavar="N", help="number of files (default 1)")
    common.add_argument("--overwrite", action="store_true", help="replace existing shards with this prefix")
    common.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    sub = parser.add_subparsers(dest="input", required=True, metavar="INPUT")

    p = sub.add_parser("images", parents=[common], help="a folder of images, one sub-folder per class")
    p.add_argument("directory")
    p.add_argument("--with-paths", action="store_true", help='add field "path" (relative to the folder)')

    p = sub.add_parser("arrays", parents=[common], help=".npy / .npz files, one record per row")
    p.add_argument("files", nargs="+")

    p = sub.add_parser("tfds", parents=[common], help="a prepared TFDS dataset split")
    p.add_argument("name")
    p.add_argument("--split", required=True)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--decode-images", action="store_true", help="store pixels, not encoded images")

    p = sub.add_parser("source", parents=[common], help="MODULE:NAME, a source or a function returning one")
    p.add_argument("spec", metavar="MODULE:NAME")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs ``grainlike-convert``; returns the exit status (0 on success, 1 on error)."""
    args = _parser().parse_args(argv)
    kw = dict(progress=not args.quiet, overwrite=args.overwrite)
    try:
        if args.input == "images":
            paths = convert_image_folder(args.directory, args.output, args.shards, include_paths=args.with_paths, **kw)
        elif args.input == "arrays":
            paths = convert_arrays(args.files, args.output, args.shards, **kw)
        elif args.input == "tfds":
            paths = convert_tfds(
                args.name, args.split, args.output, args.shards,
                data_dir=args.data_dir, decode_images=args.decode_images, **kw,
            )
        else:
            paths = convert_source(_load_object(args.spec), args.output, args.shards, **kw)
    except (OSError, ValueError, TypeError, ImportError) as e:
        print(f"grainlike-convert: error: {e}", file=sys.stderr)
        return 1
    with open(args.output + ".json") as f:
        count = json.load(f)["num_records"]
    print(f"wrote {count} records to {len(paths)} file(s):")
    for path in paths:
        print(f"  {path}")
    print(f"metadata: {args.output}.json")
    # Python that runs as printed (pasted into a file or a notebook cell).
    print("read with:")
    print(_READ_HINT.format(prefix=args.output))
    return 0


_READ_HINT = """\
    import grainlike
    source = grainlike.ArrayRecordDataSource(grainlike.formats.list_shards({prefix!r}))
    dataset = grainlike.MapDataset.source(source).map(grainlike.formats.DecodeRecord())
    print(len(dataset), dataset[0])"""


if __name__ == "__main__":
    sys.exit(main())
