"""Command-line tools, also callable from Python: ``grainlike-convert`` (``convert``)
writes datasets as ArrayRecord files; ``grainlike-inspect`` (``inspect_cli``) explains
checkpoint states and ArrayRecord files in words. Importing this package imports
nothing beyond the standard library.

No module here is named ``inspect``: it would shadow the standard library's for a
script run from this folder. The old name ``grainlike.tools.inspect`` stays an attribute.
"""

from grainlike.core.lazy import attach as _attach

__getattr__, __dir__ = _attach(globals(), {"inspect": "grainlike.tools.inspect_cli"})
