"""``grain.transforms``: the transform classes user code subclasses.

``Map``, ``RandomMap``, ``Filter`` and ``MapWithIndex`` are the classes
``grainlike.MapTransform``, ``RandomMapTransform``, ``FilterTransform`` and
``MapWithIndexTransform`` name (the same objects, as in grain). ``TfRandomMap``
runs in Python as grain's DataLoader runs it; ``DatasetSelectionMap`` is the
Dataset API's.
"""

from grainlike.core.transforms import (
    Batch,
    Filter,
    Map,
    MapWithIndex,
    RandomMap,
    TfRandomMap,
    Transformation,
    Transformations,
)
from grainlike.dataset import DatasetSelectionMap

# Every name imported above.
__all__ = sorted(name for name in dir() if not name.startswith("_"))
