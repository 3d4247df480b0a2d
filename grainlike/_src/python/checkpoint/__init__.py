from grainlike.core.lazy import attach_submodules as _attach_submodules

__getattr__, __dir__ = _attach_submodules(globals())
