"""``grain._src.python.record``: grain's private path, re-exported from grainlike."""

from grainlike import Record, RecordMetadata

__all__ = ['Record', 'RecordMetadata']
