"""How ``InMemoryDataSource`` lays its records out in one shared-memory segment.

Segment layout: an 8-byte magic, an 8-byte header length, a JSON header
(``in_memory_header``; never a pickle: another process reads it), then each leaf
buffer at a 64-byte aligned offset. Scalar sequences are stored as four
leaves: a type code per record, an 8-byte value slot per record (int64 or float64
bits), and ``offsets`` + one byte buffer for the str / bytes / big-int records.
Array records are a (nested) dict / tuple of leaves, one row per record.

Writing: ``encode_scalars`` (scalar sequences) and ``is_tree`` / ``flatten``
(array trees). Reading: ``scalar_getter`` and ``make_builder`` turn the leaves,
views of the mapping, into a ``key -> record`` function without copying.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Mapping, Sequence
from typing import Any, SupportsIndex

import numpy as np

__all__ = ["ALIGN", "MAGIC", "PICKLED_HEADER_MAGIC", "PREFIX", "align", "encode_scalars", "flatten", "is_tree", "make_builder", "scalar_getter"]

MAGIC = b"GLSRC002"
# Segments of grainlike versions whose header was a pickle: never read.
PICKLED_HEADER_MAGIC = b"GLSRC001"
PREFIX = struct.Struct("<8sQ")
ALIGN = 64

# Type codes of scalar records.
_NONE, _BOOL, _INT, _FLOAT, _STR, _BYTES, _BIGINT = range(7)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def encode_scalars(elements: Sequence[Any]) -> list[np.ndarray]:
    n = len(elements)
    codes = bytearray(n)
    ints = [0] * n
    floats = [0.0] * n
    chunks: list[bytes] = []
    lengths = [0] * n
    for i, value in enumerate(elements):
        kind = type(value)
        chunk = None  # The bytes of a str, bytes or big-int record.
        if kind is int or (isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))):
            value = int(value)
            if _INT64_MIN <= value <= _INT64_MAX:
                codes[i] = _INT
                ints[i] = value
            else:
                codes[i] = _BIGINT
                chunk = str(value).encode("ascii")
        elif kind is float or isinstance(value, (float, np.floating)):
            codes[i] = _FLOAT
            floats[i] = float(value)
        elif kind is str or isinstance(value, str):
            codes[i] = _STR
            chunk = value.encode("utf-8")
        elif isinstance(value, (bytes, bytearray, memoryview)):
            codes[i] = _BYTES
            chunk = bytes(value)
        elif value is None:
            codes[i] = _NONE
        elif isinstance(value, (bool, np.bool_)):
            codes[i] = _BOOL
            ints[i] = int(value)
        else:
            raise TypeError(
                f"InMemoryDataSource: element {i} has type {type(value).__name__} "
                f"({value!r:.80}); a sequence may hold only int, float, bool, str, bytes "
                "and None. Pass a numpy array, or a dict / tuple of equal-length numpy "
                "arrays, for array records."
            )
        if chunk is not None:
            chunks.append(chunk)
            lengths[i] = len(chunk)
    code_arr = np.frombuffer(bytes(codes), np.uint8)
    slots = np.array(ints, np.int64)
    is_float = code_arr == _FLOAT
    if is_float.any():
        slots = np.where(is_float, np.array(floats, np.float64).view(np.int64), slots)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.array(lengths, np.int64), out=offsets[1:])
    blob = np.frombuffer(b"".join(chunks), np.uint8)
    return [code_arr, slots, offsets, blob]


def is_tree(elements: Any) -> bool:
    if isinstance(elements, Mapping):
        return True
    if isinstance(elements, tuple) and elements:
        return all(isinstance(x, np.ndarray) or is_tree(x) for x in elements)
    return False


def flatten(tree: Any, leaves: list, path: str) -> Any:
    """Returns a tree definition (classes, keys, leaf indices); appends ``(path, array)`` leaves."""
    if isinstance(tree, Mapping):
        keys = list(tree.keys())
        children = tuple(flatten(tree[k], leaves, f"{path}[{k!r}]") for k in keys)
        return ("dict", type(tree), tuple(keys), children)
    if isinstance(tree, tuple):
        children = tuple(flatten(x, leaves, f"{path}[{i}]") for i, x in enumerate(tree))
        return ("tuple", type(tree), children)
    array = np.asarray(tree)
    if array.dtype.hasobject:
        raise TypeError(
            f"InMemoryDataSource: leaf {path or '<root>'} has dtype {array.dtype}; object "
            "arrays cannot be placed in shared memory."
        )
    if array.ndim == 0:
        raise ValueError(
            f"InMemoryDataSource: leaf {path or '<root>'} is a 0-d array ({array!r}); each "
            "leaf needs a leading record dimension."
        )
    leaves.append((path or "<root>", array))
    return ("leaf", len(leaves) - 1)


def make_builder(treedef: Any, leaves: list) -> Any:
    """A function ``key -> record`` that slices every leaf at ``key``."""
    kind = treedef[0]
    if kind == "leaf":
        return leaves[treedef[1]].__getitem__
    if kind == "dict":
        _, cls, keys, children = treedef
        if cls is dict and all(c[0] == "leaf" for c in children):
            # The common flat case: index the arrays directly, no nested calls.
            arrays = [(k, leaves[c[1]]) for k, c in zip(keys, children)]
            return lambda key: {k: a[key] for k, a in arrays}
        getters = [make_builder(c, leaves) for c in children]
        pairs = list(zip(keys, getters))
        if cls is dict:
            return lambda key: {k: g(key) for k, g in pairs}
        return lambda key: cls((k, g(key)) for k, g in pairs)
    _, cls, children = treedef
    getters = [make_builder(c, leaves) for c in children]
    if cls is tuple:
        return lambda key: tuple(g(key) for g in getters)
    if hasattr(cls, "_fields"):  # namedtuple
        return lambda key: cls(*(g(key) for g in getters))
    return lambda key: cls(g(key) for g in getters)


def scalar_getter(leaves: list[np.ndarray], n: int):
    codes_arr, slots_arr, offsets_arr, blob_arr = leaves
    # memoryview indexing returns Python ints/floats directly, ~5x faster than numpy
    # scalar indexing; the memoryviews reference the arrays, hence the mapping.
    codes = memoryview(codes_arr)
    ints = memoryview(slots_arr).cast("B").cast("q")
    floats = memoryview(slots_arr.view(np.float64)).cast("B").cast("d")
    offsets = memoryview(offsets_arr).cast("B").cast("q")
    blob = memoryview(blob_arr)

    def get(record_key: SupportsIndex) -> Any:
        key = operator.index(record_key)
        if key < 0:
            key += n
        if not 0 <= key < n:
            raise IndexError(f"record_key {operator.index(record_key)} out of range for InMemoryDataSource of length {n}")
        code = codes[key]
        if code == _INT:
            return ints[key]
        if code == _FLOAT:
            return floats[key]
        if code == _STR:
            return str(blob[offsets[key] : offsets[key + 1]], "utf-8")
        if code == _BYTES:
            return bytes(blob[offsets[key] : offsets[key + 1]])
        if code == _NONE:
            return None
        if code == _BOOL:
            return bool(ints[key])
        return int(str(blob[offsets[key] : offsets[key + 1]], "ascii"))

    return get
