"""The DataLoader, its iterator and state, and worker processes.

The package is also callable: ``grainlike.loader(source)`` starts the notebook
builder (``grainlike.from_source``), e.g.
``grainlike.loader(source).shuffle(0).map(f).batch(128).workers(2).build()``.
"""

import importlib
import sys
import types
from typing import Any


class _CallableLoaderPackage(types.ModuleType):
    """Lets ``grainlike.loader(source)`` build while ``grainlike.loader.X`` imports."""

    def __call__(self, source: Any) -> Any:
        # The builder sits above this package (it builds loaders from the
        # dataset stages): named only when called, so that the package imports
        # nothing from that layer and is callable however it was imported.
        return importlib.import_module("grainlike.builder").from_source(source)


sys.modules[__name__].__class__ = _CallableLoaderPackage
