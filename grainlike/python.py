"""``import grainlike.python as grain``: the same names as ``grain.python``."""

import grainlike as _grainlike
from grainlike import *  # noqa: F401,F403
from grainlike import __all__  # noqa: F401


def __getattr__(name: str):
    # The Orbax names load lazily, as on the top-level package.
    return getattr(_grainlike, name)
