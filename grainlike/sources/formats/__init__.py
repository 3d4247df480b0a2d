"""File formats and file access under the sources.

Importing them costs numpy and the standard library; ``array_record``, ``pyarrow`` and
``fsspec`` are imported when a file is opened.

* ``array_record_files``: opening ArrayRecord readers on local or remote files, counting
  a remote file's records from its tail;
* ``crc32c_checksum``: CRC-32C, the checksum of TFRecord files (google-crc32c, numpy
  fallback);
* ``tfrecord_files``: reading and writing TFRecord files (framing and checksums);
* ``parquet_files``: opening Parquet files (pyarrow, imported when a file is opened)
  and converting their columns to numpy;
* ``record_codec``: the self-describing record format ``grainlike-convert`` writes
  (``grainlike.formats``);
* ``in_memory_records``: how ``InMemoryDataSource`` lays its records out in one
  shared-memory segment (scalar encoding, array trees);
* ``remote_files``: ``s3://`` / ``gs://`` / ``file://`` objects through fsspec, with
  retries and version pins;
* ``file_cache``: the private local cache of whole remote files.

The sources (``grainlike.sources``) and the Dataset stages that read files
(``grainlike.dataset.tfrecord``, ``grainlike.dataset.parquet_iter_dataset``) are built on
these modules; they import ``grainlike.core`` only.
"""
