"""``grain.experimental``: grain's newer APIs, under the same names.

The names grain 0.2.18 has here that grainlike does not provide yet are listed,
with the reason, in ``docs/migrating.md``.
"""

from grainlike.core.index_shuffle import index_shuffle
from grainlike.core.lazy import attach as _attach
from grainlike.core.transforms import FlatMapTransform, MapWithIndexTransform
from grainlike.dataset import apply_transformations, get_next_index, set_next_index

__getattr__, __dir__ = _attach(
    globals(),
    {
        "assert_equal_output_after_checkpoint": (
            "grainlike.dataset.conformance:assert_equal_output_after_checkpoint"
        ),
    },
)

__all__ = [
    "FlatMapTransform",
    "MapWithIndexTransform",
    "apply_transformations",
    "get_next_index",
    "index_shuffle",
    "set_next_index",
]
