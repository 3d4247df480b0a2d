"""``import grainlike.python as grain``: the same names as ``grain.python``."""

import grainlike as _grainlike
from grainlike import *  # noqa: F401,F403
from grainlike import __all__  # noqa: F401


def __getattr__(name: str):
    # The Orbax names load lazily, as on the top-level package.
    if name in _grainlike._LAZY:
        return getattr(_grainlike, name)
    raise AttributeError(f"module 'grainlike.python' has no attribute {name!r}")
