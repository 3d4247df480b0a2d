"""Pytrees as nested dicts with JaxSGMC's keys, and back (JaxSGMC's ``io`` API).

Any JAX pytree has a dict form. Dicts keep their keys, lists and tuples become
``{"list_element_0": ..., ...}``, namedtuples dicts of their fields; a node type
with a rule (``register_dictionize_rule``) becomes the dict its rule names; any
other pytree node (a registered dataclass, a flax struct, ...) names its leaves
``unknown~pytree~leaf~0``, ``~1``, ... in JAX's order. The names only label leaves:
``dict_to_pytree`` and the collectors of ``grainlike.jax.sample_collectors``
rebuild a tree with JAX's own tree structure, so no leaf is lost or moved,
whatever the rules say. Importing this module costs numpy only.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["dict_to_pytree", "pytree_dict_items", "pytree_dict_keys", "pytree_to_dict", "register_dictionize_rule"]


def _dict_items(node: dict) -> Any:
    return node.items()


def _list_items(node: list) -> Any:
    return ((f"list_element_{i}", v) for i, v in enumerate(node))


def _tuple_items(node: tuple) -> Any:
    if hasattr(node, "_fields"):  # a namedtuple: its fields
        return zip(node._fields, node)
    return _list_items(node)


# node type -> rule(node) -> (name, child) pairs, tried in registration order with
# isinstance (JaxSGMC's order: dict, list and tuple first, then the user's rules).
_DICTIONIZE_RULES: dict = {dict: _dict_items, list: _list_items, tuple: _tuple_items}


def register_dictionize_rule(node_type: type) -> Callable[[Callable[[Any], Any]], None]:
    """Decorator: how a pytree node of ``node_type`` becomes a dict (JaxSGMC's ``io`` API).

    The decorated function takes a node and returns its ``(name, child)`` pairs;
    ``pytree_to_dict``, ``pytree_dict_keys`` and the collectors then name the
    node's leaves by them (HDF5 datasets, ``.npz`` entries). Only the names come
    from the rule: trees are rebuilt with JAX's tree structure, so a rule may list
    the children in any order, but it must name each of the node's leaves once.
    Dicts, lists and tuples (namedtuples by their fields) have rules already and
    are tried first, as in JaxSGMC: a rule for a subclass of them is not used.
    Pytree nodes without a rule name their leaves ``unknown~pytree~leaf~<i>``.

    Example:
      >>> import jax
      >>> class Pair:
      ...     def __init__(self, a, b):
      ...         self.a, self.b = a, b
      >>> jax.tree_util.register_pytree_node(Pair, lambda p: ((p.a, p.b), None), lambda _, c: Pair(*c))
      >>> @register_dictionize_rule(Pair)
      ... def _pair(node):
      ...     return [("a", node.a), ("b", node.b)]
      >>> pytree_to_dict({"p": Pair(1.0, [2.0])})
      {'p': {'a': 1.0, 'b': {'list_element_0': 2.0}}}

    Raises:
      TypeError: ``node_type`` is not a type.
      ValueError: a rule for ``node_type`` exists already.
    """
    if not isinstance(node_type, type):
        raise TypeError(f"register_dictionize_rule takes a type, got {node_type!r}")

    def register(rule: Callable[[Any], Any]) -> None:
        if node_type in _DICTIONIZE_RULES:
            raise ValueError(f"a dictionize rule for {node_type.__name__} is already registered")
        _DICTIONIZE_RULES[node_type] = rule

    return register


def _is_leaf(node: Any) -> bool:
    """A JAX leaf (None and empty containers included, as JAX's tree structure says)."""
    from jax import tree_util

    return tree_util.treedef_is_leaf(tree_util.tree_structure(node))


def _named_children(node: Any) -> list:
    """``[(name, child), ...]`` of a pytree node that is not a leaf."""
    from jax import tree_util

    leaves = tree_util.tree_leaves(node)
    if not leaves:  # nothing to name (a node of Nones, ...)
        return []
    for node_type, rule in _DICTIONIZE_RULES.items():
        if isinstance(node, node_type):
            return list(rule(node))
    return [(f"unknown~pytree~leaf~{i}", leaf) for i, leaf in enumerate(leaves)]


def pytree_to_dict(tree: Any) -> Any:
    """A pytree as nested dicts (JaxSGMC's keys); leaves stay as they are.

    Example:
      >>> pytree_to_dict({'a': 0.0, 'b': {'b1': [0.0, 0.1], 'b2': 0.0}})
      {'a': 0.0, 'b': {'b1': {'list_element_0': 0.0, 'list_element_1': 0.1}, 'b2': 0.0}}
    """
    if _is_leaf(tree):
        return tree
    return {name: pytree_to_dict(child) for name, child in _named_children(tree)}


class _LeafNumber:
    """Stands for leaf number ``i`` of a tree, to see where ``pytree_to_dict`` puts it."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


def _dict_leaves(as_dict: Any, path: tuple = ()) -> list:
    """``(key path, leaf)`` of every value of nested dicts that is not an empty node."""
    if type(as_dict) is dict:
        return [item for key, value in as_dict.items() for item in _dict_leaves(value, path + (key,))]
    return [] if _is_empty(as_dict) else [(path, as_dict)]


def _is_empty(node: Any) -> bool:
    from jax import tree_util

    return not isinstance(node, _LeafNumber) and not tree_util.tree_leaves(node)


def _leaf_paths(tree: Any) -> list:
    """The key path in ``pytree_to_dict(tree)`` of each leaf of ``tree``, in JAX's leaf order."""
    from jax import tree_util

    leaves, treedef = tree_util.tree_flatten(tree)
    paths: list = [None] * len(leaves)
    try:
        # The tree with each leaf replaced by its number: the rules run on it as on
        # the tree and say exactly which name each leaf gets.
        numbered = tree_util.tree_unflatten(treedef, [_LeafNumber(i) for i in range(len(leaves))])
        found = _dict_leaves(pytree_to_dict(numbered))
    except Exception:  # a rule that needs real leaves: matched by identity below
        found = None
    if found is not None and all(isinstance(leaf, _LeafNumber) for _, leaf in found):
        for path, number in found:
            if paths[number.i] is not None:
                raise ValueError(f"pytree_to_dict names leaf {number.i} twice: {paths[number.i]} and {path}")
            paths[number.i] = path
    else:
        unplaced: dict = {}
        for i, leaf in enumerate(leaves):
            unplaced.setdefault(id(leaf), []).append(i)
        for path, leaf in _dict_leaves(pytree_to_dict(tree)):
            numbers = unplaced.get(id(leaf))
            if not numbers:
                raise ValueError(
                    f"pytree_to_dict puts a value at {'/'.join(map(str, path))} that is not one of the "
                    "tree's leaves: a dictionize rule must return the node's own children"
                )
            paths[numbers.pop(0)] = path
    missing = [i for i, p in enumerate(paths) if p is None]
    if missing:
        raise ValueError(
            f"pytree_to_dict leaves out {len(missing)} of the tree's {len(leaves)} leaves "
            f"(numbers {missing[:5]}): a dictionize rule must name every child of its node"
        )
    if len(set(paths)) != len(paths):
        seen: set = set()
        twice = next(p for p in paths if p in seen or seen.add(p))
        raise ValueError(f"pytree_to_dict gives two leaves the key path {'/'.join(map(str, twice))}")
    return paths


def pytree_dict_items(tree: Any) -> list:
    """``(key path, leaf)`` of every leaf of ``tree``, in JAX's leaf order (``jax.tree.leaves``)."""
    from jax import tree_util

    return list(zip(_leaf_paths(tree), tree_util.tree_leaves(tree)))


def pytree_dict_keys(tree: Any) -> list:
    """The key path in ``pytree_to_dict(tree)`` of each leaf, in the order of ``jax.tree.leaves(tree)``.

    Example:
      >>> pytree_dict_keys({"a": [0.0, 1.0], "b": 2.0})
      [('a', 'list_element_0'), ('a', 'list_element_1'), ('b',)]

    Raises:
      ValueError: the rules name a leaf twice, leave one out, or give two the same path.
    """
    return _leaf_paths(tree)


def dict_to_pytree(pytree_as_dict: Any, target: Any) -> Any:
    """Rebuilds ``target``'s structure from ``pytree_to_dict``'s form (also of a subtree).

    The leaves are looked up by their key paths and put back with JAX's tree
    structure of ``target``, so any pytree (namedtuples, registered dataclasses,
    nodes with a dictionize rule) comes back as it was.

    Example:
      >>> tree = {'a': 0.0, 'b': {'b1': [0.0, 0.1], 'b2': 0.0}}
      >>> dict_to_pytree(pytree_to_dict(tree)['b'], tree['b'])
      {'b1': [0.0, 0.1], 'b2': 0.0}

    Raises:
      KeyError: the dict lacks a key the target has (the message names its path).
    """
    from jax import tree_util

    def value_at(path: tuple) -> Any:
        node = pytree_as_dict
        for depth, key in enumerate(path):
            if not isinstance(node, dict) or key not in node:
                raise KeyError(f"dict_to_pytree: no key {'/'.join(map(str, path[:depth + 1]))!r} in the dict")
            node = node[key]
        return node

    return tree_util.tree_unflatten(tree_util.tree_structure(target), [value_at(p) for p in _leaf_paths(target)])
