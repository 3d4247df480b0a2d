"""The Dataset API's stages: each transformation of a ``MapDataset`` or ``IterDataset`` in its own module."""
