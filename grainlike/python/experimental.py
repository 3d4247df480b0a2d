"""``grain.python.experimental``: the same names as ``grainlike.experimental``."""

from grainlike import experimental as _experimental
from grainlike.core.lazy import attach as _attach
from grainlike.experimental import *  # noqa: F401,F403
from grainlike.experimental import __all__  # noqa: F401

__getattr__, __dir__ = _attach(
    globals(),
    {name: f"grainlike.experimental:{name}" for name in _experimental.__dir__()
     if not name.startswith("_") and name not in _experimental.__all__},
)
