"""grain's protobuf messages (``grain.proto``): the execution summaries of debug statistics.

Its module loads the protobuf runtime when first read, so ``import grainlike``
does not import protobuf (an optional dependency: ``pip install grainlike[proto]``).
"""

from grainlike.core.lazy import attach_submodules as _attach_submodules

__getattr__, __dir__ = _attach_submodules(globals())
