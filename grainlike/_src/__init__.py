"""grain's private module paths, for code written against them: ``grainlike._src.X`` is ``grain._src.X``.

Each module only re-exports grainlike objects with the same meaning; a name
grainlike lacks is left out. Map the paths with ``sys.modules`` or import
``grainlike._src.python...`` directly; see docs/migrating.md. ``import grainlike``
does not import this package.
"""
