from grainlike.core.tree import flatten, map_structure, spec_like, unflatten_as

__all__ = ['flatten', 'map_structure', 'spec_like', 'unflatten_as']
