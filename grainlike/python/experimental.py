"""``grain.python.experimental``: the same names as ``grainlike.experimental``."""

from grainlike.experimental import *  # noqa: F401,F403
from grainlike.experimental import __all__  # noqa: F401
