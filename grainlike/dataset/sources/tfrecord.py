"""``TFRecordIterDataset``: the records of a TFRecord file as ``bytes``, read without TensorFlow.

The state is grain's: ``{"reader_offset": byte offset of the next record}``.
"""

from __future__ import annotations

import os
from typing import Union

from grainlike.core.errors import CorruptRecordError
from grainlike.core.protocols import close_if_closeable
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.nodes.state import non_negative_int, require_keys
from grainlike.sources.formats.tfrecord_files import TFRecordFile, _TFRecordReader, write_tfrecords

__all__ = ["CorruptRecordError", "TFRecordIterDataset", "write_tfrecords"]


class _TFRecordDatasetIterator(DatasetIterator):
    """grain's TFRecord iterator protocol: reads through ``self._reader`` (``__next__``, ``seek``, ``tell``).

    Subclasses may set their own reader (MaxText's GCS iterator does).
    """

    def __init__(self, path: Union[str, os.PathLike]):
        super().__init__()
        self._reader = _TFRecordReader(path)

    def __next__(self) -> bytes:
        return next(self._reader)

    def get_state(self) -> dict:
        return {"reader_offset": self._reader.tell()}

    def set_state(self, state: dict) -> None:
        require_keys(state, self, ("reader_offset",))
        self._reader.seek(non_negative_int(state, "reader_offset", self))

    def _close(self) -> None:
        """Closes the reader's file."""
        close_if_closeable(getattr(self, "_reader", None))  # None: closed before it was opened


class _PreadTFRecordDatasetIterator(TFRecordFile, _TFRecordDatasetIterator):
    """Reads one local TFRecord file with ``TFRecordFile`` (blocks read with ``os.pread``, checked together)."""

    def __init__(self, path: Union[str, os.PathLike]):
        DatasetIterator.__init__(self)
        TFRecordFile.__init__(self, path)

    def get_state(self) -> dict:
        self._assert_not_closed()
        return {"reader_offset": self.tell()}

    def set_state(self, state: dict) -> None:
        self._assert_not_closed()
        require_keys(state, self, ("reader_offset",))
        self.seek(non_negative_int(state, "reader_offset", self))

    def close(self) -> None:
        """Closes the file."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        TFRecordFile.close(self)

    def __str__(self) -> str:
        return f"TFRecordDatasetIterator(path={self._path!r})"


class TFRecordIterDataset(IterDataset):
    """The records of the TFRecord file at ``path``, as ``bytes``.

    The file is opened by each iterator, in the process that iterates. Parse
    ``tf.train.Example`` records with a map (e.g. with the ``tensorflow`` or
    ``protobuf`` package).

    Example:
      >>> import os, tempfile
      >>> with tempfile.TemporaryDirectory() as folder:
      ...     path = os.path.join(folder, "data.tfrecord")
      ...     write_tfrecords(path, [b"a", b"bc"])
      ...     list(TFRecordIterDataset(path))
      [b'a', b'bc']

    Raises (on iteration):
      FileNotFoundError: there is no file at ``path``.
      CorruptRecordError (a ValueError): the file is truncated or a checksum does
        not match.
    """

    def __init__(self, path: Union[str, os.PathLike]):
        super().__init__()
        self._path = path

    def __iter__(self) -> DatasetIterator:
        return _PreadTFRecordDatasetIterator(self._path)

    def __str__(self) -> str:
        return f"TFRecordIterDataset(path={os.fspath(self._path)!r})"
