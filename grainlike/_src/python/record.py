from grainlike import Record, RecordMetadata

__all__ = ['Record', 'RecordMetadata']
