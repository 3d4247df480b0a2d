"""grain's private module paths, for code written against them: ``grainlike._src.X`` is ``grain._src.X``.

Each module only re-exports grainlike objects with the same meaning; a name
grainlike lacks is left out. Map the paths with ``sys.modules`` or import
``grainlike._src.python...`` directly; see docs/migrating.md. ``import grainlike``
does not import this package: it is the attribute ``grainlike._src``, and each of
its modules an attribute of its package, loaded on first use.
"""

from grainlike.core.lazy import attach_submodules as _attach_submodules

# Each package's submodules are attributes, loaded on first use (as after ``import grain``).
__getattr__, __dir__ = _attach_submodules(globals())
