"""``grain._src.python.checkpoint.handler``: grain's private path, re-exported from grainlike."""

from grainlike.checkpoint import CheckpointHandler, CheckpointRestore, CheckpointSave

__all__ = ['CheckpointHandler', 'CheckpointRestore', 'CheckpointSave']
