"""grain's ``tree_lib`` functions under grain's names, with grain's key-tuple paths.

``grainlike.core.tree`` is the walker; this face gives its functions the names
and path convention of grain's ``grain._src.core.tree_lib``:
``map_structure_with_path`` and ``flatten_with_path`` pass paths as tuples of
keys (``('image', 0)``), not as the printable strings of ``tree``'s functions
of those names.
"""

from grainlike.core.tree import (
    assert_same_structure,
    estimate_byte_size,
    flatten,
    flatten_with_key_path as flatten_with_path,
    map_structure,
    map_structure_with_key_path as map_structure_with_path,
    spec_like,
    unflatten_as,
)

__all__ = [
    "assert_same_structure",
    "estimate_byte_size",
    "flatten",
    "flatten_with_path",
    "map_structure",
    "map_structure_with_path",
    "spec_like",
    "unflatten_as",
]
