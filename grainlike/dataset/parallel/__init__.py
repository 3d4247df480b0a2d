"""Pipelines computed in several workers: worker slicing, ``mp_prefetch``, threads, tuning and elastic restore."""
