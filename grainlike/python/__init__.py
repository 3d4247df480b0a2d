"""``import grainlike.python as grain``: the names of ``grain.python``.

The same objects as the top-level ``grainlike`` package (which has the names of
both ``grain`` and ``grain.python``), except ``experimental``: here it is
``grainlike.python.experimental``, mirroring ``grain.python.experimental``.
"""

import importlib as _importlib

import grainlike as _grainlike
from grainlike import *  # noqa: F401,F403
from grainlike import __all__  # noqa: F401
from grainlike.core.lazy import attach as _attach

__getattr__, __dir__ = _attach(
    globals(),
    {name: f"grainlike:{name}" for name in _grainlike._LAZY if name not in ("experimental", "python", "_src")},
)

# Replaces the star import's grainlike.experimental (a package attribute is set when
# its submodule is imported; ``from grainlike.python import`` would find the old one).
experimental = _importlib.import_module("grainlike.python.experimental")
