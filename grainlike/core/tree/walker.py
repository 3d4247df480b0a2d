"""The tree walker: node kinds, mapping over trees, flattening and rebuilding them.

See ``grainlike.core.tree`` for what a tree is made of. Paths name a leaf's place
(``['image'][0].label``); ``StructureError`` says where two trees differ.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from grainlike.core.errors import StructureError

# Node kinds.
_LEAF, _DICT, _SEQ, _NAMEDTUPLE, _DATACLASS, _NONE = range(6)


class _Field(str):
    """A dataclass field name in a path (printed ``.name``, not ``['name']``)."""

    __slots__ = ()


def is_namedtuple(x: Any) -> bool:
    """Whether ``x`` is a namedtuple instance (a tuple whose type has ``_fields``)."""
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _kind(x: Any) -> int:
    t = type(x)
    # Exact types first: these are nearly all the nodes and leaves seen per record.
    if t is np.ndarray:
        return _LEAF
    if t is dict:
        return _DICT
    if t is list or t is tuple:
        return _SEQ
    if x is None:
        return _NONE
    if isinstance(x, dict):
        return _DICT
    if isinstance(x, tuple):
        return _NAMEDTUPLE if hasattr(t, "_fields") else _SEQ
    if isinstance(x, list):
        return _SEQ
    # An instance, not a dataclass type: a class's own type has no such attribute.
    # A dataclass that declares itself a leaf (``tree_leaf = True``, e.g. a spec) is one.
    if hasattr(t, "__dataclass_fields__") and not getattr(t, "tree_leaf", False):
        return _DATACLASS
    return _LEAF


def _kind_name(x: Any) -> str:
    kind = _kind(x)
    if kind == _LEAF:
        return f"a leaf ({type(x).__name__})"
    if kind == _NONE:
        return "None"
    return type(x).__name__


def _path_str(path: tuple) -> str:
    return "".join(f".{p}" if type(p) is _Field else f"[{p!r}]" for p in path)


def _fields(x: Any) -> list:
    return [f.name for f in dataclasses.fields(x)]


def _rebuild_dict(like: dict, items: list) -> dict:
    t = type(like)
    if t is dict:
        return dict(items)
    if isinstance(like, collections.defaultdict):
        out = t(like.default_factory)  # its first argument is the factory
        out.update(items)
        return out
    return t(items)


def _rebuild_dataclass(like: Any, names: list, values: list) -> Any:
    # Neither __init__ nor __post_init__ runs again: stacked fields would fail
    # checks meant for one record. Works for frozen and slotted dataclasses too.
    out = copy.copy(like)
    for name, value in zip(names, values):
        object.__setattr__(out, name, value)
    return out


def _same_types(trees: Sequence[Any], t: type) -> bool:
    for v in trees:
        if type(v) is not t:
            return False
    return True


def _check_leaves(path: tuple, leaves: Sequence[Any]) -> None:
    """Raises ``StructureError`` if a tree has a node where the first has a leaf."""
    if len(leaves) > 1 and not _same_types(leaves, type(leaves[0])):
        for v in leaves:
            if _kind(v) != _LEAF:
                raise StructureError(_path_str(path), f"expected a leaf, got {_kind_name(v)}")


def _map(fn: Callable, trees: Sequence[Any], path: tuple, is_leaf: Optional[Callable]) -> Any:
    """Rebuilds ``trees[0]`` with ``fn(path, leaves)`` at each leaf, ``leaves`` holding every tree's value there.

    All trees must share ``trees[0]``'s nodes (else ``StructureError``); whether the others have
    leaves there too is for ``fn`` to check (``_check_leaves``), so ``stack`` keeps it off the hot path.
    """
    first = trees[0]
    if is_leaf is not None and is_leaf(first):
        return fn(path, trees)
    kind = _kind(first)
    if kind == _LEAF:
        return fn(path, trees)
    if kind == _DICT:
        keys = first.keys()
        for v in trees:
            if not isinstance(v, dict):
                raise StructureError(_path_str(path), f"expected a dict, got {_kind_name(v)}")
            if v.keys() != keys:
                raise StructureError(
                    _path_str(path), f"dict keys differ: {list(keys)} and {list(v.keys())}"
                )
        items = [(k, _map(fn, [v[k] for v in trees], path + (k,), is_leaf)) for k in keys]
        return _rebuild_dict(first, items)
    if kind == _NONE:
        for v in trees:
            if v is not None:
                raise StructureError(_path_str(path), f"expected None, got {_kind_name(v)}")
        return None
    t = type(first)
    if kind == _DATACLASS:
        if not _same_types(trees, t):
            other = next(v for v in trees if type(v) is not t)
            raise StructureError(_path_str(path), f"expected {t.__name__}, got {_kind_name(other)}")
        names = _fields(first)
        values = [
            _map(fn, [getattr(v, n) for v in trees], path + (_Field(n),), is_leaf) for n in names
        ]
        return _rebuild_dataclass(first, names, values)
    n = len(first)
    for v in trees:
        if type(v) is not t or len(v) != n:
            raise StructureError(_path_str(path), f"expected {t.__name__} of length {n}")
    items = [_map(fn, [v[i] for v in trees], path + (i,), is_leaf) for i in range(n)]
    if kind == _NAMEDTUPLE:
        return t(*items)
    if t is list:
        return items
    if t is tuple:
        return tuple(items)
    return t(items)


def _map_leaves(name: str, fn: Callable, trees: tuple, is_leaf: Optional[Callable],
                path: Optional[Callable[[tuple], Any]] = None) -> Any:
    """The map_structure functions: ``fn(*leaves)``, or ``fn(path(key_path), *leaves)``."""
    if not trees:
        raise TypeError(f"{name} needs at least one tree")
    if path is None:
        def leaf(key_path: tuple, leaves: Sequence[Any]) -> Any:
            _check_leaves(key_path, leaves)
            return fn(*leaves)
    else:
        def leaf(key_path: tuple, leaves: Sequence[Any]) -> Any:
            _check_leaves(key_path, leaves)
            return fn(path(key_path), *leaves)
    return _map(leaf, trees, (), is_leaf)


def map_structure(fn: Callable[..., Any], *trees: Any, is_leaf: Optional[Callable[[Any], bool]] = None) -> Any:
    """Applies ``fn`` to the leaves of ``trees`` at each position, keeping the structure.

    Args:
      fn: called as ``fn(leaf_of_tree_0, leaf_of_tree_1, ...)``.
      *trees: one or more trees with the same structure.
      is_leaf: optional predicate; a value for which it is true is passed to
        ``fn`` whole instead of walked into.

    Returns:
      A tree shaped like ``trees[0]`` holding ``fn``'s results.

    Raises:
      StructureError: the trees differ in structure; the message names where.

    Example:
      >>> map_structure(lambda a, b: a + b, {"x": 1, "y": (2, 3)}, {"x": 10, "y": (20, 30)})
      {'x': 11, 'y': (22, 33)}
    """
    return _map_leaves("map_structure", fn, trees, is_leaf)


def map_structure_with_path(fn: Callable[..., Any], *trees: Any) -> Any:
    """Like ``map_structure``, calling ``fn(path, *leaves)`` with the leaf's path.

    The path is a string such as ``['image'][0]`` or ``.label`` (a dataclass
    field); ``''`` for a tree that is one leaf.
    """
    return _map_leaves("map_structure_with_path", fn, trees, None, _path_str)


def map_structure_with_key_path(fn: Callable[..., Any], *trees: Any,
                                is_leaf: Optional[Callable[[Any], bool]] = None) -> Any:
    """Like ``map_structure``, calling ``fn(key_path, *leaves)``; grain's ``map_structure_with_path``.

    The key path is a tuple of the keys that lead to the leaf: dict keys,
    sequence indices (namedtuples too, as in grain without jax; with jax, grain
    names the field) and dataclass field names, e.g. ``('image', 0)``; ``()``
    for a tree that is one leaf. ``is_leaf`` is ``map_structure``'s.

    Example:
      >>> map_structure_with_key_path(lambda p, x: p, {"a": [5, 6]})
      {'a': [('a', 0), ('a', 1)]}
    """
    return _map_leaves("map_structure_with_key_path", fn, trees, is_leaf, tuple)


def assert_same_structure(a: Any, b: Any) -> None:
    """Raises ``StructureError`` unless ``a`` and ``b`` have the same nodes; leaves may differ.

    Nodes agree when they have the same type, the same dict keys (in any order)
    and the same lengths; a leaf in one where the other has a node is a
    difference.
    """
    # ``_map`` catches a node of ``a`` against a leaf of ``b``; ``_check_leaves`` the reverse.
    _map(_check_leaves, [a, b], (), None)


_KEY, _STR = 1, 2


def _visit(x: Any, path: tuple, out: list, with_path: int) -> None:
    kind = _kind(x)
    if kind == _LEAF:
        if with_path == _STR:
            out.append((_path_str(path), x))
        elif with_path == _KEY:
            out.append((path, x))
        else:
            out.append(x)
    elif kind == _DICT:
        for k, v in x.items():
            _visit(v, path + (k,), out, with_path)
    elif kind == _DATACLASS:
        for name in _fields(x):
            _visit(getattr(x, name), path + (_Field(name),), out, with_path)
    elif kind != _NONE:
        for i, v in enumerate(x):
            _visit(v, path + (i,), out, with_path)


def flatten(tree: Any) -> list:
    """The leaves of ``tree``, in walking order (dicts in key order as inserted).

    Example:
      >>> flatten({"a": [1, 2], "b": None, "c": 3})
      [1, 2, 3]
    """
    if _kind(tree) == _LEAF:
        return [tree]
    out: list = []
    _visit(tree, (), out, 0)
    return out


def flatten_with_path(tree: Any) -> list[tuple[str, Any]]:
    """``(path, leaf)`` pairs of ``tree`` in ``flatten``'s order.

    Example:
      >>> flatten_with_path({"a": [1, 2]})
      [("['a'][0]", 1), ("['a'][1]", 2)]
    """
    out: list = []
    _visit(tree, (), out, _STR)
    return out


def flatten_with_key_path(tree: Any) -> list[tuple[tuple, Any]]:
    """``(key_path, leaf)`` pairs of ``tree`` in ``flatten``'s order; grain's ``flatten_with_path``.

    Example:
      >>> flatten_with_key_path({"a": [1, 2]})
      [(('a', 0), 1), (('a', 1), 2)]
    """
    out: list = []
    _visit(tree, (), out, _KEY)
    return out


def unflatten_as(structure: Any, leaves: Sequence[Any]) -> Any:
    """A tree shaped like ``structure`` holding ``leaves`` in ``flatten``'s order.

    Raises:
      ValueError: ``leaves`` has more or fewer items than ``structure`` has leaves.
    """
    it: Iterator[Any] = iter(leaves)
    try:
        out = _map(lambda _, __: next(it), [structure], (), None)
    except StopIteration:
        raise ValueError(
            f"unflatten_as: {len(leaves)} leaves given, fewer than the structure has"
        ) from None
    if next(it, it) is not it:
        raise ValueError(
            f"unflatten_as: {len(leaves)} leaves given, more than the "
            f"{len(flatten(structure))} the structure has"
        )
    return out


def zeros_like(tree: Any) -> Any:
    """A tree of the same structure, shapes and dtypes as ``tree``, all zeros."""
    return _map(lambda _, leaves: np.zeros_like(np.asarray(leaves[0])), [tree], (), None)

