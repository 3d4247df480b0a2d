from grainlike.dataset.transformations.packing import get_non_sequence_meta_features

__all__ = ['get_non_sequence_meta_features']
