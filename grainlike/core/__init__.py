"""Sampler, record metadata, sharding and transforms: numpy and the standard library only."""
