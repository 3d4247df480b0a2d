from grainlike.checkpoint import CheckpointHandler, CheckpointRestore, CheckpointSave

__all__ = ['CheckpointHandler', 'CheckpointRestore', 'CheckpointSave']
