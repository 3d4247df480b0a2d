from grainlike.checkpoint import PyGrainCheckpointHandler, PyGrainCheckpointRestore, PyGrainCheckpointSave

__all__ = ['PyGrainCheckpointHandler', 'PyGrainCheckpointRestore', 'PyGrainCheckpointSave']
