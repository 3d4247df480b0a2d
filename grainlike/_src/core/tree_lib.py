from grainlike.core.tree_lib import assert_same_structure, estimate_byte_size, flatten, flatten_with_path, map_structure, map_structure_with_path, spec_like, unflatten_as

__all__ = ['assert_same_structure', 'estimate_byte_size', 'flatten', 'flatten_with_path', 'map_structure', 'map_structure_with_path', 'spec_like', 'unflatten_as']
