"""File formats and file access under the sources: ArrayRecord, TFRecord (with its
CRC-32C), Parquet, the record format ``grainlike-convert`` writes, the layout of
in-memory records, and remote files with their private local cache.

Importing them costs numpy and the standard library; ``array_record``, ``pyarrow``
and ``fsspec`` are imported when a file is opened.
"""
