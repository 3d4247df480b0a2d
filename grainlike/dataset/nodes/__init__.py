"""The Dataset API's base protocol: the dataset node, ``MapDataset``, ``IterDataset``, ``DatasetIterator``, options and state checks."""
