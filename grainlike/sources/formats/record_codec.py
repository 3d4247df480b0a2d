"""The record format written by ``grainlike-convert``, and its decoder.

Each ArrayRecord record is one example: a dict of named fields (nested dicts
allowed), or a single bare value. A record is laid out as::

    offset 0   b"GLR1"                       magic and format version
    offset 4   uint32, little-endian: H      length of the header
    offset 8   H bytes of UTF-8 JSON         the header: a list of fields
    offset 8+H the fields' bytes, back to back, in header order

Each header entry is ``[name, kind, dtype, shape, nbytes]``:

* ``name``: the field's key; nested dicts are flattened with ``/``
  (``{"a": {"b": x}}`` is field ``"a/b"``); ``null`` for a bare value;
* ``kind``: ``"array"`` (raw C-order bytes of a numpy array, ``dtype`` its
  numpy type string such as ``"<f4"`` or ``"|u1"``, ``shape`` a list of ints),
  ``"bytes"`` (kept as they are, e.g. an encoded PNG / JPEG), or ``"str"``
  (UTF-8 text); ``dtype`` and ``shape`` are ``null`` for the last two;
* ``nbytes``: the field's length in bytes.

Python ``int`` / ``float`` / ``bool`` are stored as 0-d arrays (int64,
float64, bool) and read back as numpy scalars. Any language that reads JSON
and raw little-endian numbers reads the format; no pickle is involved.

Example:
    >>> import numpy as np
    >>> record = encode_record({"image": b"\\x89PNG...", "label": 3,
    ...                         "mask": np.zeros((2, 2), np.uint8)})
    >>> out = decode_record(record)
    >>> out["label"], out["mask"].shape, out["image"][:4]
    (np.int64(3), (2, 2), b'\\x89PNG')
"""

from __future__ import annotations

import glob
import json
import os
import re
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from grainlike.core.errors import RecordFormatError
from grainlike.core.transforms import MapTransform

__all__ = [
    "MAGIC",
    "DecodeRecord",
    "RecordFormatError",
    "decode_record",
    "describe_record",
    "encode_record",
    "list_shards",
]

MAGIC = b"GLR1"
_HEADER_LEN = struct.Struct("<I")
_PREFIX = len(MAGIC) + _HEADER_LEN.size
_SEP = "/"


def _flatten(value: Any, prefix: str, out: list) -> None:
    for key, item in value.items():
        if not isinstance(key, str):
            raise RecordFormatError(
                f"field names must be str, got {key!r} ({type(key).__name__}) in "
                f"{prefix.rstrip(_SEP) or 'the record'}"
            )
        if _SEP in key or not key:
            raise RecordFormatError(
                f"field name {prefix + key!r} must be non-empty and not contain {_SEP!r} "
                "(it separates the names of nested dicts)"
            )
        if isinstance(item, Mapping):
            if not item:
                raise RecordFormatError(f"field {prefix + key!r} is an empty dict; it cannot be stored")
            _flatten(item, prefix + key + _SEP, out)
        else:
            out.append((prefix + key, item))


def _encode_field(name: Any, value: Any) -> tuple[list, bytes]:
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return [name, "bytes", None, None, len(data)], data
    if isinstance(value, str):
        data = value.encode("utf-8")
        return [name, "str", None, None, len(data)], data
    array = np.asarray(value)
    if array.dtype.kind in "OSUVMm" or array.dtype.fields is not None:
        shown = "the record" if name is None else f"field {name!r}"
        raise RecordFormatError(
            f"{shown} has type {type(value).__name__} (numpy dtype {array.dtype}); storable "
            "values are numeric / bool numpy arrays and scalars, bytes and str"
        )
    data = np.ascontiguousarray(array).tobytes()
    return [name, "array", array.dtype.str, list(array.shape), len(data)], data


def encode_record(value: Any) -> bytes:
    """Serialises one example into the format described in this module.

    Args:
      value: a dict (possibly nested) of numpy arrays, numpy / Python scalars,
        ``bytes`` and ``str``; or one such value on its own.

    Returns:
      The record's bytes.

    Raises:
      RecordFormatError: a value of another type (object arrays, lists of
        strings, None, ...), a non-str or ``/``-containing field name; the
        message names the field.
    """
    if isinstance(value, Mapping):
        items: list = []
        _flatten(value, "", items)
        if not items:
            raise RecordFormatError("the record is an empty dict; there is nothing to store")
    else:
        items = [(None, value)]
    header, payload = [], []
    for name, item in items:
        entry, data = _encode_field(name, item)
        header.append(entry)
        payload.append(data)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return b"".join([MAGIC, _HEADER_LEN.pack(len(head)), head, *payload])


def _header(record: bytes) -> tuple[list, int]:
    if not isinstance(record, (bytes, bytearray, memoryview)):
        raise RecordFormatError(
            f"expected a record of bytes, got {type(record).__name__}; decode_record reads "
            "what ArrayRecordDataSource returns"
        )
    if bytes(record[:4]) != MAGIC or len(record) < _PREFIX:
        raise RecordFormatError(
            f"not a grainlike record: it starts with {bytes(record[:8])!r}, expected {MAGIC!r} "
            "(files written by grainlike-convert; `grainlike-inspect FILE` shows what a file holds)"
        )
    (size,) = _HEADER_LEN.unpack_from(record, len(MAGIC))
    try:
        header = json.loads(bytes(record[_PREFIX : _PREFIX + size]))
    except ValueError as e:
        raise RecordFormatError(f"grainlike record has a corrupt header ({e})") from e
    return header, _PREFIX + size


def decode_record(record: bytes, copy: bool = True) -> Any:
    """Reads back a record written by ``encode_record``.

    Args:
      record: the record's bytes.
      copy: return writable arrays (copies); with ``False``, arrays are
        read-only views of ``record`` (no copy, but they keep it alive).

    Returns:
      The dict (nested as it was written) or the bare value; arrays come back
      with their dtype and shape, 0-d arrays as numpy scalars.

    Raises:
      RecordFormatError: the bytes are not such a record, or are truncated.
    """
    header, offset = _header(record)
    buffer = memoryview(record)
    out: dict = {}
    bare: Any = None
    for name, kind, dtype, shape, nbytes in header:
        end = offset + nbytes
        if end > len(buffer):
            raise RecordFormatError(
                f"grainlike record is truncated: field {name!r} needs bytes [{offset}, {end}) "
                f"of a {len(buffer)}-byte record"
            )
        chunk = buffer[offset:end]
        offset = end
        if kind == "bytes":
            value: Any = bytes(chunk)
        elif kind == "str":
            value = bytes(chunk).decode("utf-8")
        elif kind == "array":
            value = np.frombuffer(chunk, dtype=np.dtype(dtype)).reshape(shape)
            if copy:
                value = value.copy()
            if not shape:
                value = value[()]
        else:
            raise RecordFormatError(f"grainlike record: field {name!r} has unknown kind {kind!r}")
        if name is None:
            bare = value
            continue
        node = out
        *parents, leaf = name.split(_SEP)
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return bare if header and header[0][0] is None else out


# The first bytes of the image formats grainlike-convert stores, and their names.
IMAGE_SIGNATURES = {b"\x89PNG\r\n\x1a\n": "PNG image", b"\xff\xd8\xff": "JPEG image", b"GIF8": "GIF image",
                    b"BM": "BMP image", b"RIFF": "RIFF (e.g. WebP) data", b"II*\x00": "TIFF image",
                    b"MM\x00*": "TIFF image"}


def describe_record(record: bytes, show_values: bool = False) -> list[str]:
    """One line per field of a record: name, kind, dtype and shape or size.

    Args:
      record: the record's bytes.
      show_values: append the value of small arrays (up to 16 elements) and
        of strings (up to 60 characters).

    Encoded images are named by their signature (PNG, JPEG, ...).
    """
    header, _ = _header(record)
    decoded = decode_record(record, copy=False)
    lines = []
    for name, kind, dtype, shape, nbytes in header:
        label = "(the record)" if name is None else name
        value = decoded
        if name is not None:
            for part in name.split(_SEP):
                value = value[part]
        shown = ""
        if kind == "array":
            dt = np.dtype(dtype)
            order = " big-endian" if dt.byteorder == ">" else ""
            text = f"{label}: array {dt.name}{order} shape {tuple(shape)}"
            if show_values and np.size(value) <= 16:
                shown = f" = {np.asarray(value).tolist()}"
        elif kind == "str":
            text = f"{label}: str of {nbytes} bytes"
            if show_values:
                shown = f" = {value[:60]!r}"
        else:
            what = next((w for sig, w in IMAGE_SIGNATURES.items() if value.startswith(sig)), None)
            text = f"{label}: {nbytes} bytes" + (f" ({what})" if what else "")
        lines.append(text + shown)
    return lines


class DecodeRecord(MapTransform):
    """``MapTransform`` that decodes records written by ``grainlike-convert``.

    Put it first in ``operations`` after an ``ArrayRecordDataSource`` over the
    converted files.

    Args:
      copy: see ``decode_record``; ``True`` (the default) gives writable arrays.

    Example:
        import grainlike as grain
        from grainlike import vision
        from grainlike.formats import DecodeRecord, list_shards

        source = grain.ArrayRecordDataSource(list_shards("/data/flowers-train"))
        operations = [DecodeRecord(), vision.Decode(key="image"),
                      vision.Resize(64, key="image"), grain.Batch(32)]
    """

    def __init__(self, copy: bool = True):
        self.copy = copy

    def map(self, element: bytes) -> Any:
        return decode_record(element, copy=self.copy)

    def __repr__(self) -> str:
        return f"DecodeRecord(copy={self.copy})"


def list_shards(prefix: str) -> list[str]:
    """The files ``grainlike-convert -o PREFIX`` wrote, in order.

    Args:
      prefix: the ``--output`` prefix, e.g. ``"/data/flowers-train"``.

    Returns:
      ``PREFIX-00000-of-0000N.array_record``, ... sorted by shard number.

    Raises:
      FileNotFoundError: no shard exists, or some of the N are missing (the
        message lists which).
    """
    pattern = re.compile(re.escape(os.path.basename(prefix)) + r"-(\d{5})-of-(\d{5})\.array_record")
    found = {}
    for path in glob.glob(glob.escape(prefix) + "-*-of-*.array_record"):
        m = pattern.fullmatch(os.path.basename(path))
        if m:
            found.setdefault(int(m.group(2)), {})[int(m.group(1))] = path
    if not found:
        raise FileNotFoundError(f"no shards {prefix}-NNNNN-of-NNNNN.array_record found")
    if len(found) > 1:
        raise FileNotFoundError(
            f"shards of several conversions share the prefix {prefix!r}: "
            f"-of-{', -of-'.join(f'{n:05d}' for n in sorted(found))}; remove the stale ones"
        )
    ((count, shards),) = found.items()
    missing = [i for i in range(count) if i not in shards]
    if missing:
        raise FileNotFoundError(
            f"{prefix}: shards {missing} of {count} are missing "
            f"(e.g. {prefix}-{missing[0]:05d}-of-{count:05d}.array_record)"
        )
    return [shards[i] for i in range(count)]
