"""``grain._src.python.dataset.sources.tfrecord_dataset``: grain's private path, re-exported from grainlike."""

from grainlike.dataset.tfrecord import TFRecordIterDataset, _TFRecordDatasetIterator, _TFRecordReader

__all__ = ['TFRecordIterDataset', '_TFRecordDatasetIterator', '_TFRecordReader']
