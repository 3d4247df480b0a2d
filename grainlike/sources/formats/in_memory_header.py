"""The header of an ``InMemoryDataSource`` segment: JSON that describes the leaves, never code.

A process attaching a named segment learns from this header how many records it
holds, the structure of a record and where each leaf lies. The header is JSON
(UTF-8): reading it runs no code, whoever wrote it. Every value is checked before
use: dtypes are numpy type strings without Python objects, shapes and offsets are
integers that fit in the segment. Container classes other than ``dict`` and
``tuple`` (an ``OrderedDict``, a namedtuple) are named by module and qualified
name, and looked up (importing the module) only in segments already checked to
be this user's own and written by nobody else (``core.shm_owner.check_own``).

Header fields::

    {"kind": "scalars" | "array" | "tree", "len": N,
     "treedef": null | ["leaf", i] | ["dict", class, [key, ...], [child, ...]]
                | ["tuple", class, [child, ...]],
     "leaves": [[offset, [dim, ...], dtype] or [offset, [dim, ...], dtype, "aligned"], ...]}

``class`` is null for ``dict`` / ``tuple`` or ``[module, qualname]``; a key is
``["s", str]``, ``["i", int]``, ``["f", float]``, ``["b", bool]``, ``["n"]``,
``["y", hex of bytes]`` or ``["t", [key, ...]]``; ``dtype`` is
``numpy.lib.format.dtype_to_descr``'s description (a type string, or a list of
``[name, dtype]`` / ``[name, dtype, [dim, ...]]`` fields), and ``"aligned"`` marks
a structured dtype made with ``align=True`` (which the description leaves out).
"""

from __future__ import annotations

import importlib
import json
import operator
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

__all__ = ["HeaderError", "decode", "encode"]

# Deeper record structures are refused when read (and cannot be described when written).
_MAX_TREE_DEPTH = 64
_KINDS = ("scalars", "array", "tree")


class HeaderError(ValueError):
    """A header that is not JSON in the format above, or describes leaves outside the segment."""


class _Unencodable(TypeError):
    """A key or container class the header cannot name (a named source refuses it)."""


# -- writing ---------------------------------------------------------------------------


def _class_ref(cls: type, base: type) -> Optional[list]:
    if cls is base:
        return None
    module, qualname = getattr(cls, "__module__", None), getattr(cls, "__qualname__", "")
    if not isinstance(module, str) or not qualname or "<" in qualname:
        raise _Unencodable(f"the class {cls!r} (defined inside a function) cannot be found by name in another process")
    return [module, qualname]


def _key(key: Any) -> list:
    # bool before int: True is an int too.
    if isinstance(key, bool):
        return ["b", key]
    if isinstance(key, str):
        return ["s", key]
    if isinstance(key, int):
        return ["i", int(key)]
    if isinstance(key, float):
        return ["f", key]
    if key is None:
        return ["n"]
    if isinstance(key, bytes):
        return ["y", key.hex()]
    if isinstance(key, tuple):
        return ["t", [_key(k) for k in key]]
    raise _Unencodable(
        f"the key {key!r} of type {type(key).__name__} cannot be described in a named segment's "
        "header (keys there: str, int, float, bool, None, bytes, tuples of them)"
    )


def _treedef(node: Any) -> list:
    kind = node[0]
    if kind == "leaf":
        return ["leaf", node[1]]
    if kind == "dict":
        _, cls, keys, children = node
        return ["dict", _class_ref(cls, dict), [_key(k) for k in keys], [_treedef(c) for c in children]]
    _, cls, children = node
    return ["tuple", _class_ref(cls, tuple), [_treedef(c) for c in children]]


def encode(meta: dict, named: bool) -> bytes:
    """The header of ``meta`` (``kind``, ``len``, ``treedef``, ``leaves``) as UTF-8 JSON.

    Args:
      meta: the description ``InMemoryDataSource`` builds.
      named: the segment is named, so other processes will read this header;
        then a structure it cannot describe is an error. Anonymous segments are
        read only through their pickled description, and their header may
        leave the structure out.

    Raises:
      TypeError: ``named`` and a key or container class of the records cannot
        be named in the header.
    """
    try:
        treedef = None if meta["treedef"] is None else _treedef(meta["treedef"])
    except _Unencodable as e:
        if named:
            raise TypeError(f"InMemoryDataSource(name=...): {e}; pass it without name=.") from None
        treedef = None
    leaves = []
    for off, shape, dtype in meta["leaves"]:
        dtype = np.dtype(dtype)
        entry = [int(off), [int(d) for d in shape], np.lib.format.dtype_to_descr(dtype)]
        if dtype.isalignedstruct:
            entry.append("aligned")
        leaves.append(entry)
    header = {"kind": meta["kind"], "len": int(meta["len"]), "treedef": treedef, "leaves": leaves}
    return json.dumps(header, separators=(",", ":"), allow_nan=True).encode("utf-8")


# -- reading ---------------------------------------------------------------------------


def _int(value: Any, what: str, low: int = 0, high: int = 2**63 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise HeaderError(f"{what} must be an int in [{low}, {high}], got {value!r:.80}")
    return value


def _list(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise HeaderError(f"{what} must be a list, got {value!r:.80}")
    return value


def _descr(value: Any, depth: int = 0) -> Any:
    """Checks a JSON dtype description: a type string or a list of fields."""
    if isinstance(value, str):
        return value
    if depth < 8 and isinstance(value, list) and value:
        fields = []
        for field in value:
            if not isinstance(field, list) or len(field) not in (2, 3) or not isinstance(field[0], str):
                raise HeaderError(f"a dtype field must be [name, dtype] or [name, dtype, shape], got {field!r:.80}")
            entry = [field[0], _descr(field[1], depth + 1)]
            if len(field) == 3:
                entry.append(tuple(_int(d, "a field's dimension") for d in _list(field[2], "a field's shape")))
            fields.append(tuple(entry))
        return fields
    raise HeaderError(f"a dtype must be a numpy type string or a list of fields, got {value!r:.80}")


def _dtype(value: Any, aligned: bool = False) -> np.dtype:
    try:
        dtype = np.lib.format.descr_to_dtype(_descr(value))
        if aligned and dtype.names:
            fields = [dtype.fields[n] for n in dtype.names]
            layout = {
                "names": list(dtype.names),
                "formats": [f[0] for f in fields],
                "offsets": [f[1] for f in fields],
                "itemsize": dtype.itemsize,
            }
            dtype = np.dtype(layout, align=True)
    except HeaderError:
        raise
    except Exception as e:  # numpy's parser refuses the description
        raise HeaderError(f"{value!r:.80} is not a numpy dtype: {e}") from None
    if dtype.hasobject:
        raise HeaderError(f"dtype {dtype} holds Python objects, which shared memory cannot")
    return dtype


def _decode_key(value: Any, depth: int) -> Any:
    if not isinstance(value, list) or not value or not isinstance(value[0], str) or depth > _MAX_TREE_DEPTH:
        raise HeaderError(f"a key must be a tagged list such as ['s', 'name'], got {value!r:.80}")
    tag, rest = value[0], value[1:]
    if tag == "n" and not rest:
        return None
    if len(rest) == 1:
        (v,) = rest
        if tag == "s" and isinstance(v, str):
            return v
        if tag == "b" and isinstance(v, bool):
            return v
        if tag == "i" and isinstance(v, int) and not isinstance(v, bool):
            return v
        if tag == "f" and isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        if tag == "y" and isinstance(v, str):
            try:
                return bytes.fromhex(v)
            except ValueError:
                pass
        if tag == "t" and isinstance(v, list):
            return tuple(_decode_key(k, depth + 1) for k in v)
    raise HeaderError(f"{value!r:.80} is not a key")


def _resolve(ref: Any, base: type) -> type:
    """The class named by ``ref`` (None: ``base``), which must subclass ``base``'s role."""
    if ref is None:
        return base
    if not (isinstance(ref, list) and len(ref) == 2 and all(isinstance(x, str) and x for x in ref)):
        raise HeaderError(f"a class must be [module, qualname], got {ref!r:.80}")
    module_name, qualname = ref
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception as e:
        raise HeaderError(f"the records' class {module_name}.{qualname} cannot be found here: {e}") from None
    role = Mapping if base is dict else tuple
    if not isinstance(obj, type) or not issubclass(obj, role):
        raise HeaderError(f"{module_name}.{qualname} is not a {role.__name__} class")
    return obj


def _decode_tree(node: Any, n_leaves: int, depth: int, seen: set) -> tuple:
    if depth > _MAX_TREE_DEPTH:
        raise HeaderError(f"the record structure is nested deeper than {_MAX_TREE_DEPTH} levels")
    if not isinstance(node, list) or not node:
        raise HeaderError(f"a structure node must be a non-empty list, got {node!r:.80}")
    kind = node[0]
    if kind == "leaf" and len(node) == 2:
        index = _int(node[1], "a leaf index", 0, n_leaves - 1)
        if index in seen:
            raise HeaderError(f"leaf {index} appears twice in the record structure")
        seen.add(index)
        return ("leaf", index)
    if kind == "dict" and len(node) == 4:
        cls = _resolve(node[1], dict)
        keys = tuple(_decode_key(k, 0) for k in _list(node[2], "a dict's keys"))
        children = tuple(_decode_tree(c, n_leaves, depth + 1, seen) for c in _list(node[3], "a dict's children"))
        if len(keys) != len(children):
            raise HeaderError(f"a dict node has {len(keys)} keys and {len(children)} children")
        return ("dict", cls, keys, children)
    if kind == "tuple" and len(node) == 3:
        cls = _resolve(node[1], tuple)
        children = tuple(_decode_tree(c, n_leaves, depth + 1, seen) for c in _list(node[2], "a tuple's children"))
        return ("tuple", cls, children)
    raise HeaderError(f"{node!r:.80} is not a structure node")


def decode(raw: bytes, data_size: int) -> dict:
    """The description in the header ``raw``, checked against a data area of ``data_size`` bytes.

    Returns:
      ``{"kind", "len", "treedef", "leaves"}`` as ``encode`` was given them:
      leaves as ``(offset, shape tuple, numpy dtype)``.

    Raises:
      HeaderError (a ValueError): anything not in the format, or a leaf outside
        the data area.
    """
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise HeaderError(f"the header is not JSON: {type(e).__name__}: {e}"[:300]) from None
    if not isinstance(header, dict) or set(header) != {"kind", "len", "treedef", "leaves"}:
        raise HeaderError(f"the header must be an object with kind, len, treedef and leaves, got {raw[:80]!r}")
    kind = header["kind"]
    if kind not in _KINDS:
        raise HeaderError(f"kind must be one of {_KINDS}, got {kind!r:.80}")
    n = _int(header["len"], "len")
    leaves = []
    for entry in _list(header["leaves"], "leaves"):
        if not isinstance(entry, list) or not (len(entry) == 3 or entry[3:] == ["aligned"]):
            raise HeaderError(f"a leaf must be [offset, shape, dtype(, 'aligned')], got {entry!r:.80}")
        offset = _int(entry[0], "a leaf's offset", 0, data_size)
        shape = tuple(_int(d, "a leaf's dimension") for d in _list(entry[1], "a leaf's shape"))
        dtype = _dtype(entry[2], aligned=len(entry) == 4)
        nbytes = dtype.itemsize
        for d in shape:
            nbytes = operator.mul(nbytes, d)
        if offset + nbytes > data_size:
            raise HeaderError(
                f"a leaf of {nbytes} bytes at offset {offset} ends past the segment's data ({data_size} bytes)"
            )
        leaves.append((offset, shape, dtype))
    if kind == "scalars":
        if header["treedef"] is not None or len(leaves) != 4:
            raise HeaderError("a scalar sequence has no structure and four leaves")
        expected = [(n,), (n,), (n + 1,)]
        if [s for _, s, _ in leaves[:3]] != expected or len(leaves[3][1]) != 1:
            raise HeaderError(f"the leaves of {n} scalar records have the wrong shapes")
        if [d for _, _, d in leaves] != [np.dtype(np.uint8), np.dtype(np.int64), np.dtype(np.int64), np.dtype(np.uint8)]:
            raise HeaderError("the leaves of scalar records have the wrong dtypes")
        treedef = None
    else:
        if header["treedef"] is None:
            raise HeaderError("this segment's records have no structure in its header")
        seen: set = set()
        treedef = _decode_tree(header["treedef"], len(leaves), 0, seen)
        if kind == "array" and treedef[0] != "leaf":
            raise HeaderError("an array source's structure is one leaf")
        if len(seen) != len(leaves):
            raise HeaderError(f"the record structure uses {len(seen)} of {len(leaves)} leaves")
        for _, shape, _ in leaves:
            if not shape or shape[0] != n:
                raise HeaderError(f"a leaf of shape {shape} does not hold {n} records")
    return {"kind": kind, "len": n, "treedef": treedef, "leaves": leaves}
