from grainlike.dataset.tfrecord import TFRecordIterDataset, _TFRecordDatasetIterator, _TFRecordReader

__all__ = ['TFRecordIterDataset', '_TFRecordDatasetIterator', '_TFRecordReader']
