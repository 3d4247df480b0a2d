from grainlike.checkpoint.elastic_checkpoint import (
    ShardStatesCheckpointable,
    get_checkpoint_process_count,
    restore_elastic_iterator,
    save_elastic_iterator,
)

__all__ = [
    'ShardStatesCheckpointable',
    'get_checkpoint_process_count',
    'restore_elastic_iterator',
    'save_elastic_iterator',
]
