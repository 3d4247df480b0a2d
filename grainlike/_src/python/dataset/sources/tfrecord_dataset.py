from grainlike.dataset.sources.tfrecord import TFRecordIterDataset, _TFRecordDatasetIterator, _TFRecordReader

__all__ = ['TFRecordIterDataset', '_TFRecordDatasetIterator', '_TFRecordReader']
