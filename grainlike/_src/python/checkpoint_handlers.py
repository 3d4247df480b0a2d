"""``grain._src.python.checkpoint_handlers``: grain's private path, re-exported from grainlike."""

from grainlike.checkpoint import PyGrainCheckpointHandler, PyGrainCheckpointRestore, PyGrainCheckpointSave

__all__ = ['PyGrainCheckpointHandler', 'PyGrainCheckpointRestore', 'PyGrainCheckpointSave']
