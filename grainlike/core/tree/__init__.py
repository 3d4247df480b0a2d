"""Nested structures of arrays ("trees"): walking, mapping, describing and stacking.

The one place in grainlike that knows how records and batches nest. A tree is
made of these nodes, with every other value a leaf:

- ``dict`` and its subclasses (``OrderedDict``, ``defaultdict``, ...), walked in
  key order as inserted;
- ``list`` and ``tuple`` (and their subclasses), including namedtuples;
- dataclass instances, walked field by field (unless the class sets
  ``tree_leaf = True``: ``ShapeDtypeStruct`` is a leaf, as in grain);
- ``None``, a node without children (as in JAX: it stays ``None``).

numpy arrays, numpy and Python scalars, ``bytes`` and ``str`` are leaves. JAX's
``jax.tree_util`` agrees on dicts, lists, tuples, namedtuples and ``None``; it
treats an unregistered dataclass or dict subclass as a leaf, where this module
walks into it (so a batch of dataclasses is a dataclass of stacked arrays).

Every name is imported from here: ``walker`` maps, flattens and rebuilds, ``specs``
sizes and describes, ``stacking`` makes batches. numpy and the standard library only.
"""

from grainlike.core.errors import StructureError
from grainlike.core.tree.specs import estimate_byte_size, estimate_nbytes, shape_spec, spec_like, spec_of
from grainlike.core.tree.stacking import DEVICE_KINDS, Allocator, Stacker, stack
from grainlike.core.tree.walker import (
    assert_same_structure,
    flatten,
    flatten_with_key_path,
    flatten_with_path,
    is_namedtuple,
    map_structure,
    map_structure_with_key_path,
    map_structure_with_path,
    unflatten_as,
    zeros_like,
)

__all__ = [
    "DEVICE_KINDS",
    "Allocator",
    "StructureError",
    "assert_same_structure",
    "estimate_byte_size",
    "estimate_nbytes",
    "flatten",
    "flatten_with_key_path",
    "flatten_with_path",
    "is_namedtuple",
    "map_structure",
    "map_structure_with_key_path",
    "map_structure_with_path",
    "shape_spec",
    "spec_like",
    "spec_of",
    "stack",
    "Stacker",
    "unflatten_as",
    "zeros_like",
]
