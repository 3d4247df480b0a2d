"""``TFRecordIterDataset``: the records of a TFRecord file, read without TensorFlow.

A TFRecord file is a sequence of records, each framed as::

    uint64 length (little-endian)
    uint32 masked CRC-32C of the 8 length bytes
    byte   data[length]
    uint32 masked CRC-32C of the data

The iterator yields each record's ``data`` as ``bytes`` and checks both CRCs. Its
state is grain's: ``{"reader_offset": byte offset of the next record}``.
"""

from __future__ import annotations

import os
import struct
from typing import Any, BinaryIO, Iterable, Optional, Union

from grainlike.dataset.base import DatasetIterator, IterDataset
from grainlike.dataset.crc32c import masked_crc32c
from grainlike.dataset.state import non_negative_int, require_keys

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")


class CorruptRecordError(ValueError):
    """A TFRecord file is truncated or a record's checksum does not match."""


class _TFRecordDatasetIterator(DatasetIterator):
    """Reads one TFRecord file from start to end; see the module docstring."""

    def __init__(self, path: Union[str, os.PathLike]):
        super().__init__()
        self._path = os.fspath(path)
        self._file: Optional[BinaryIO] = open(self._path, "rb")

    def _corrupt(self, offset: int, what: str) -> CorruptRecordError:
        return CorruptRecordError(f"Not a valid TFRecord: {self._path} at byte {offset}: {what}")

    def __next__(self) -> bytes:
        self._assert_not_closed()
        f = self._file
        offset = f.tell()
        header = f.read(_HEADER.size)
        if not header:
            raise StopIteration
        if len(header) != _HEADER.size:
            raise self._corrupt(offset, f"fewer than {_HEADER.size} bytes of header: {header.hex()}")
        length, length_crc = _HEADER.unpack(header)
        if masked_crc32c(header[:8]) != length_crc:
            raise self._corrupt(offset, f"the length's checksum does not match (length field {length})")
        body = f.read(length + _FOOTER.size)
        if len(body) != length + _FOOTER.size:
            raise self._corrupt(
                offset, f"the record of {length} bytes is truncated ({len(body)} of {length + 4} bytes left)"
            )
        data = body[:length]
        (data_crc,) = _FOOTER.unpack_from(body, length)
        if masked_crc32c(data) != data_crc:
            raise self._corrupt(offset, f"the checksum of the {length}-byte record does not match")
        return data

    def get_state(self) -> dict:
        self._assert_not_closed()
        return {"reader_offset": self._file.tell()}

    def set_state(self, state: dict) -> None:
        self._assert_not_closed()
        require_keys(state, self, ("reader_offset",))
        self._file.seek(non_negative_int(state, "reader_offset", self))

    def close(self) -> None:
        """Closes the file."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        if self._file is not None:
            self._file.close()
            self._file = None

    def __str__(self) -> str:
        return f"TFRecordDatasetIterator(path={self._path!r})"


class TFRecordIterDataset(IterDataset):
    """The records of the TFRecord file at ``path``, as ``bytes``.

    The file is opened by each iterator, in the process that iterates. Parse
    ``tf.train.Example`` records with a map (e.g. with the ``tensorflow`` or
    ``protobuf`` package).

    Example:
      >>> import os, tempfile
      >>> path = os.path.join(tempfile.mkdtemp(), "data.tfrecord")
      >>> write_tfrecords(path, [b"a", b"bc"])
      >>> list(TFRecordIterDataset(path))
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
        return _TFRecordDatasetIterator(self._path)

    def __str__(self) -> str:
        return f"TFRecordIterDataset(path={os.fspath(self._path)!r})"


def write_tfrecords(path: Union[str, os.PathLike], records: Iterable[Any]) -> None:
    """Writes ``records`` (bytes-like) to a TFRecord file at ``path`` (grainlike only).

    Raises:
      TypeError: a record is not bytes-like.
    """
    with open(path, "wb") as f:
        for i, record in enumerate(records):
            try:
                data = bytes(memoryview(record))
            except TypeError:
                raise TypeError(f"write_tfrecords: record {i} is not bytes-like: {record!r:.80}") from None
            length = struct.pack("<Q", len(data))
            f.write(length)
            f.write(_FOOTER.pack(masked_crc32c(length)))
            f.write(data)
            f.write(_FOOTER.pack(masked_crc32c(data)))
