"""Stacking nested structures (dicts, tuples, lists, namedtuples) of arrays into batches."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

# Allocates the output of one stacked leaf; workers pass one that returns arrays in
# shared memory so a batch is written once and never copied again.
Allocator = Callable[[tuple, np.dtype], np.ndarray]


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def spec_of(value: Any) -> Any:
    """The structure of ``value`` with leaves replaced by ``dtype[shape]`` strings."""
    if isinstance(value, dict):
        return {k: spec_of(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [spec_of(v) for v in value]
        if _is_namedtuple(value):
            return type(value)(*items)
        return type(value)(items)
    arr = np.asarray(value) if not isinstance(value, np.ndarray) else value
    return f"{arr.dtype}{list(arr.shape)}"


def shape_spec(value: Any) -> Any:
    """The structure of ``value`` with leaves replaced by their shapes.

    What must agree for elements to stack (dtypes may differ: ``np.stack``
    promotes them, as in grain).
    """
    if isinstance(value, dict):
        return {k: shape_spec(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [shape_spec(v) for v in value])
    return tuple(np.shape(value))


def _stack_leaf(leaves: Sequence[Any], alloc: Optional[Allocator]) -> np.ndarray:
    first = leaves[0]
    if alloc is not None and isinstance(first, np.ndarray) and not first.dtype.hasobject:
        shape = (len(leaves),) + first.shape
        dtype = first.dtype
        for leaf in leaves:
            if not isinstance(leaf, np.ndarray) or leaf.shape != first.shape or leaf.dtype != dtype:
                break
        else:
            out = alloc(shape, dtype)
            np.stack(leaves, out=out)
            return out
    # np.stack picks the common dtype (e.g. the widest string) for mixed leaves.
    return np.stack([np.asarray(x) for x in leaves])


def _mismatch(values: Sequence[Any], path: str, detail: str) -> ValueError:
    specs = "\n".join(f"  element {i}: {spec_of(v)!r}" for i, v in enumerate(values[:8]))
    more = f"\n  ... and {len(values) - 8} more" if len(values) > 8 else ""
    where = f" at {path}" if path else ""
    return ValueError(
        f"Batch: cannot stack the elements{where}: {detail}. All elements of a batch "
        "must have the same structure and shapes (differing dtypes are promoted, as "
        f"np.stack does). Got:\n{specs}{more}"
    )


def _stack(values: Sequence[Any], alloc: Optional[Allocator], path: str, root: Sequence[Any]) -> Any:
    first = values[0]
    if isinstance(first, dict):
        keys = first.keys()
        for v in values:
            if not isinstance(v, dict) or v.keys() != keys:
                raise _mismatch(root, path, "dict keys differ")
        return type(first)(
            (k, _stack([v[k] for v in values], alloc, f"{path}[{k!r}]", root)) for k in keys
        ) if type(first) is not dict else {
            k: _stack([v[k] for v in values], alloc, f"{path}[{k!r}]", root) for k in keys
        }
    if isinstance(first, (list, tuple)):
        n = len(first)
        kind = type(first)
        for v in values:
            if type(v) is not kind or len(v) != n:
                raise _mismatch(root, path, f"expected {kind.__name__} of length {n}")
        items = [_stack([v[i] for v in values], alloc, f"{path}[{i}]", root) for i in range(n)]
        if _is_namedtuple(first):
            return kind(*items)
        return kind(items)
    try:
        return _stack_leaf(values, alloc)
    except ValueError as e:
        raise _mismatch(root, path, str(e)) from e


def stack(values: Sequence[Any], alloc: Optional[Allocator] = None) -> Any:
    """Stacks a non-empty sequence of equally structured elements leaf by leaf.

    Args:
      values: elements with the same nested structure, leaf shapes and dtypes.
      alloc: optional allocator for the stacked leaves (for shared memory).

    Returns:
      One element of the same structure whose leaves have a new leading axis.

    Raises:
      ValueError: the elements differ in structure or shape; the message shows the
        structure of each element.

    Example:
      >>> stack([{"x": 1}, {"x": 2}])["x"]
      array([1, 2])
    """
    if not values:
        raise ValueError("Batch: cannot stack an empty list of elements.")
    return _stack(values, alloc, "", values)
