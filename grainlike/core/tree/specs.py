"""What a tree holds, said without its values: sizes in bytes and printable specs.

``estimate_nbytes`` sizes read-ahead chunks; ``spec_of`` / ``shape_spec`` describe
elements in errors and batch checks; ``spec_like`` is grain's ``tree_lib.spec_like``.
"""

from __future__ import annotations

import pprint
from typing import Any, Optional

import numpy as np

from grainlike.core.tree.walker import _DATACLASS, _fields, _kind, _map, flatten


def _estimate(tree: Any, other_leaf_bytes: int) -> int:
    t = type(tree)
    if t is np.ndarray:
        return tree.nbytes
    if t is bytes or t is str:
        return len(tree)
    total = 0
    for leaf in flatten(tree):
        if isinstance(leaf, np.ndarray):
            total += leaf.nbytes
        elif isinstance(leaf, (bytes, bytearray, str)):
            total += len(leaf)
        else:
            total += other_leaf_bytes
    return total


def estimate_nbytes(tree: Any) -> int:
    """Roughly how many bytes ``tree`` holds: its arrays, byte strings and strings.

    Other leaves count 8 bytes each, so that a record of scalars still costs
    something when read-ahead chunks are sized by bytes.
    """
    return _estimate(tree, 8)


def estimate_byte_size(tree: Any) -> int:
    """grain's ``tree_lib.estimate_byte_size``: the bytes of ``tree``'s arrays, byte strings and strings.

    Other leaves (numbers, objects) count 0, as in grain.

    Example:
      >>> estimate_byte_size({"a": "v2", "b": 1.5, "c": np.zeros(3, np.float32)})
      14
    """
    return _estimate(tree, 0)


def spec_of(tree: Any) -> Any:
    """``tree`` with each leaf replaced by a ``dtype[shape]`` string, e.g. ``'uint8[28, 28]'``."""

    def describe(_: tuple, leaves: list) -> str:
        x = leaves[0]
        arr = x if isinstance(x, np.ndarray) else np.asarray(x)
        return f"{arr.dtype}{list(arr.shape)}"

    return _map(describe, [tree], (), None)


def shape_spec(tree: Any) -> Any:
    """``tree`` with each leaf replaced by its shape.

    What must agree for elements to stack (dtypes may differ: ``np.stack``
    promotes them, as in grain).
    """
    return _map(lambda _, leaves: tuple(np.shape(leaves[0])), [tree], (), None)


def _attrs_fields(x: Any) -> Optional[list]:
    """The field names of an ``attrs`` class instance, else None (``attrs`` is not imported)."""
    attributes = getattr(type(x), "__attrs_attrs__", None)
    if attributes is None or isinstance(x, type):
        return None
    return [a.name for a in attributes]


def spec_like(tree: Any) -> Any:
    """grain's ``tree_lib.spec_like``: ``tree`` with leaves replaced by type-and-shape strings.

    A list or tuple whose items all have the first item's type is one leaf
    (``'list<int>[3]'``); an array is ``'<dtype>[<shape>]'``; a dataclass or
    ``attrs`` instance names its type and the spec of its fields; other leaves are
    ``'<type name>[<shape>]'`` (``'int[]'``, ``'bytes[]'``). Used to check that
    an iterator's state keeps its shape from step to step.
    """

    def homogeneous(x: Any) -> bool:
        return isinstance(x, (list, tuple)) and all(isinstance(i, type(x[0])) for i in x)

    def type_of(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return x.dtype
        if homogeneous(x):
            return f"{type(x).__name__}<{type(x[0]).__name__ if x else ''}>"
        names = _fields(x) if _kind(x) == _DATACLASS else _attrs_fields(x)
        if names is not None:
            fields = {name: getattr(x, name) for name in names}
            return f"{type(x).__name__}\n{pprint.pformat(spec_like(fields))}"
        return type(x).__name__

    def shape_of(x: Any) -> Any:
        try:
            return list(np.asarray(x).shape)
        except ValueError:
            return "[unknown shape]"

    def is_leaf(x: Any) -> bool:
        # As in grain: homogeneous sequences and dataclasses are described whole.
        return homogeneous(x) or _kind(x) == _DATACLASS or _attrs_fields(x) is not None

    return _map(lambda _, leaves: f"{type_of(leaves[0])}{shape_of(leaves[0])}", [tree], (), is_leaf)

