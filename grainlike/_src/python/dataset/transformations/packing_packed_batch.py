from grainlike.dataset.packing import get_non_sequence_meta_features

__all__ = ['get_non_sequence_meta_features']
