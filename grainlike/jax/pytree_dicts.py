"""Pytrees as nested dicts with JaxSGMC's keys, and back (JaxSGMC's ``io`` API).

Lists and tuples become ``{"list_element_0": ..., ...}``, namedtuples dicts of
their fields, dicts keep their keys (in JAX's sorted order); node types of the
user's get a rule with ``register_dictionize_rule``. The collectors of
``grainlike.jax.sample_collectors`` name saved leaves by these keys.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from grainlike.core.tree import is_namedtuple, map_structure, map_structure_with_key_path

__all__ = ["dict_to_pytree", "pytree_dict_items", "pytree_dict_keys", "pytree_to_dict", "register_dictionize_rule",
           "unflatten_dict_leaves"]


# Rules for node types of the user's: type -> rule(node) -> [(name, child), ...].
_DICTIONIZE_RULES: dict = {}


def register_dictionize_rule(node_type: type) -> Callable[[Callable[[Any], Any]], None]:
    """Decorator: how a pytree node of ``node_type`` becomes a dict (JaxSGMC's ``io`` API).

    The decorated function takes a node and returns its ``(name, child)`` pairs,
    in the order of the node's leaves; ``pytree_to_dict``, ``pytree_dict_keys``,
    ``dict_to_pytree`` and the collectors then name its leaves by them. Dicts,
    lists, tuples and namedtuples have rules already.

    Example:
      >>> class Pair:
      ...     def __init__(self, a, b):
      ...         self.a, self.b = a, b
      >>> @register_dictionize_rule(Pair)
      ... def _pair(node):
      ...     return [("a", node.a), ("b", node.b)]
      >>> pytree_to_dict({"p": Pair(1.0, [2.0])})
      {'p': {'a': 1.0, 'b': {'list_element_0': 2.0}}}

    Raises:
      ValueError: a rule for ``node_type`` exists already.
    """
    if not isinstance(node_type, type):
        raise TypeError(f"register_dictionize_rule takes a type, got {node_type!r}")

    def register(rule: Callable[[Any], Any]) -> None:
        if node_type in _DICTIONIZE_RULES:
            raise ValueError(f"a dictionize rule for {node_type.__name__} is already registered")
        _DICTIONIZE_RULES[node_type] = rule

    return register


def _children(node: Any) -> Optional[list]:
    """``[(name, child), ...]`` of a container node (JaxSGMC's names), None for a leaf."""
    if node is None:
        return []
    for node_type, rule in _DICTIONIZE_RULES.items():
        if isinstance(node, node_type):
            return [(str(k), v) for k, v in rule(node)]
    if isinstance(node, dict):
        # JAX flattens a dict in sorted key order; leaves here follow the same order.
        return [(k, node[k]) for k in sorted(node)]
    if is_namedtuple(node):
        return list(zip(node._fields, node))
    if isinstance(node, (list, tuple)):
        return [(f"list_element_{i}", v) for i, v in enumerate(node)]
    return None


def pytree_to_dict(tree: Any) -> Any:
    """A pytree of dicts, lists, tuples and namedtuples as nested dicts (JaxSGMC's keys).

    Lists and tuples become ``{"list_element_0": ..., ...}``, namedtuples dicts of
    their fields; leaves stay as they are.

    Example:
      >>> pytree_to_dict({'a': 0.0, 'b': {'b1': [0.0, 0.1], 'b2': 0.0}})
      {'a': 0.0, 'b': {'b1': {'list_element_0': 0.0, 'list_element_1': 0.1}, 'b2': 0.0}}
    """
    children = _children(tree)
    if children is None:
        return tree
    return {str(k): pytree_to_dict(v) for k, v in children}


def pytree_dict_items(pytree: Any) -> list:
    """``(key path, leaf)`` of every leaf of ``pytree_to_dict(pytree)``, in leaf order (core.tree's walk)."""
    out: list = []
    map_structure_with_key_path(lambda path, leaf: out.append((path, leaf)), pytree_to_dict(pytree),
                                is_leaf=_not_a_dict)
    return out


def _not_a_dict(node: Any) -> bool:
    # pytree_to_dict makes every node a plain dict; anything else is one of its leaves.
    return type(node) is not dict


def pytree_dict_keys(tree: Any) -> list:
    """The key path of every leaf of ``pytree_to_dict(tree)``, in leaf order.

    Example:
      >>> pytree_dict_keys({"a": [0.0, 1.0], "b": 2.0})
      [('a', 'list_element_0'), ('a', 'list_element_1'), ('b',)]
    """
    return [path for path, _ in pytree_dict_items(tree)]


def dict_to_pytree(pytree_as_dict: Any, target: Any) -> Any:
    """Rebuilds ``target``'s structure from ``pytree_to_dict``'s form (also of a subtree).

    Example:
      >>> tree = {'a': 0.0, 'b': {'b1': [0.0, 0.1], 'b2': 0.0}}
      >>> dict_to_pytree(pytree_to_dict(tree)['b'], tree['b'])
      {'b1': [0.0, 0.1], 'b2': 0.0}

    Raises:
      KeyError: the dict lacks a key the target has (the message names its path).
    """

    def build(node: Any, target_node: Any, path: tuple) -> Any:
        children = _children(target_node)
        if children is None:
            return node
        if target_node is None:
            return None
        values = []
        for k, v in children:
            if not isinstance(node, dict) or str(k) not in node:
                raise KeyError(f"dict_to_pytree: no key {'/'.join(path + (str(k),))!r} in the dict")
            values.append(build(node[str(k)], v, path + (str(k),)))
        if isinstance(target_node, dict):
            return dict(zip([k for k, _ in children], values))
        if is_namedtuple(target_node):
            return type(target_node)(*values)
        return type(target_node)(values)

    return build(pytree_as_dict, target, ())


def unflatten_dict_leaves(template: Any, leaves: list) -> Any:
    """``template``'s structure with ``leaves`` (in ``pytree_dict_keys`` order) at its leaves."""
    it = iter(leaves)
    as_dict = map_structure(lambda _: next(it), pytree_to_dict(template), is_leaf=_not_a_dict)
    return dict_to_pytree(as_dict, template)
