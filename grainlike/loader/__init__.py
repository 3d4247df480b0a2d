"""The DataLoader, its iterator and state, and worker processes.

The package is also callable: ``grainlike.loader(source)`` starts the notebook
builder (``grainlike.from_source``), e.g.
``grainlike.loader(source).shuffle(0).map(f).batch(128).workers(2).build()``.
"""

import sys
import types


class _CallablePackage(types.ModuleType):
    """Lets ``grainlike.loader(source)`` build while ``grainlike.loader.X`` imports."""

    def __call__(self, source):
        from grainlike.builder import from_source  # The builder sits above this layer.

        return from_source(source)


sys.modules[__name__].__class__ = _CallablePackage
