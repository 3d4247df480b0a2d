"""The types of an element's leaves, comparable between grain and grainlike.

``type_name`` names a value's type so that a class and its grainlike
counterpart compare equal (``SharedMemoryArray`` from ``grain.python`` and from
``grainlike``) while everything else keeps its full name
(``numpy.ndarray``, ``builtins.int``). ``leaf_types`` walks an element and lists,
for every node and leaf, its path, type name, and for arrays dtype, shape and
memory order: what differential tests compare besides the values.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

_OWN_MODULES = ("grain", "grainlike")


def type_name(x: Any) -> str:
    """``type(x)``'s name: qualified name for grain's and grainlike's classes, module too for others."""
    t = type(x)
    if t.__module__.split(".")[0] in _OWN_MODULES:
        return t.__qualname__
    return f"{t.__module__}.{t.__qualname__}"


def _order(x: np.ndarray) -> str:
    if x.flags.c_contiguous:
        return "C"
    return "F" if x.flags.f_contiguous else "strided"


def leaf_types(tree: Any, path: str = "") -> list:
    """``[(path, type name[, dtype, shape, order]), ...]`` for every node and leaf of ``tree``.

    Dicts are walked in key order (grain with JAX sorts them, grainlike keeps
    their order: the keys compare, not their order), sequences, namedtuples and
    dataclasses in field order.
    """
    out, x = [], tree
    if isinstance(x, dict):
        out.append((path, type_name(x)))
        for k in sorted(x, key=repr):
            out += leaf_types(x[k], f"{path}[{k!r}]")
    elif isinstance(x, (list, tuple)):
        out.append((path, type_name(x)))
        for i, v in enumerate(x):
            out += leaf_types(v, f"{path}[{i}]")
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        out.append((path, type_name(x)))
        for f in dataclasses.fields(x):
            out += leaf_types(getattr(x, f.name), f"{path}.{f.name}")
    elif isinstance(x, np.ndarray):
        out.append((path, type_name(x), str(x.dtype), x.shape, _order(x)))
    else:
        out.append((path, type_name(x)))
    return out
