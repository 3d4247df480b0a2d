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

import collections
import os
import struct
from typing import Any, BinaryIO, Iterable, Optional, Union

from grainlike.dataset.base import DatasetIterator, IterDataset
from grainlike.dataset.crc32c import crc32c_many, masked, masked_crc32c
from grainlike.dataset.state import non_negative_int, require_keys

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
# Records read at once: the first block is small, so the first record comes soon.
_FIRST_BLOCK = 8
_BLOCK_RECORDS = 256
_BLOCK_BYTES = 4 << 20
# Records at least this long get their checksum alone (in numpy lanes); shorter
# ones of similar lengths together, when at least _MIN_GROUP of them are (a
# crc32c_many step costs about as much as 25 bytes of the byte loop).
_ALONE_BYTES = 16384
_MIN_GROUP = 16


class CorruptRecordError(ValueError):
    """A TFRecord file is truncated or a record's checksum does not match."""


class _TFRecordDatasetIterator(DatasetIterator):
    """Reads one TFRecord file from start to end; see the module docstring.

    Records are read in blocks (8 at first, doubling to ``_BLOCK_RECORDS``) whose
    data checksums are verified together (``crc32c_many``); an error found in a
    block is raised when the iteration reaches the record that has it.
    """

    def __init__(self, path: Union[str, os.PathLike]):
        super().__init__()
        self._path = os.fspath(path)
        self._file: Optional[BinaryIO] = open(self._path, "rb")
        self._offset = 0  # Of the next record returned.
        # (data, offset after it), or (CorruptRecordError, offset of its record).
        self._ready: collections.deque = collections.deque()
        self._block = _FIRST_BLOCK

    def _corrupt(self, offset: int, what: str) -> CorruptRecordError:
        return CorruptRecordError(f"Not a valid TFRecord: {self._path} at byte {offset}: {what}")

    def _read_block(self) -> None:
        """Reads up to a block of records into ``_ready``, checked; nothing at the end."""
        f = self._file
        records: list = []  # (offset, length, body = data + footer)
        error = None
        size = 0
        while len(records) < self._block and size < _BLOCK_BYTES:
            offset = f.tell()
            header = f.read(_HEADER.size)
            if not header:
                break
            if len(header) != _HEADER.size:
                error = (self._corrupt(offset, f"fewer than {_HEADER.size} bytes of header: {header.hex()}"), offset)
                break
            length, length_crc = _HEADER.unpack(header)
            # Checked before the length is trusted to read the data.
            if masked_crc32c(header[:8]) != length_crc:
                error = (self._corrupt(offset, f"the length's checksum does not match (length field {length})"), offset)
                break
            body = f.read(length + _FOOTER.size)
            if len(body) != length + _FOOTER.size:
                what = f"the record of {length} bytes is truncated ({len(body)} of {length + 4} bytes left)"
                error = (self._corrupt(offset, what), offset)
                break
            records.append((offset, length, body))
            size += length
        self._block = min(self._block * 2, _BLOCK_RECORDS)
        datas = [memoryview(body)[:length] for _, length, body in records]
        crcs = _data_crcs(datas)
        for (offset, length, body), data, crc in zip(records, datas, crcs):
            (expected,) = _FOOTER.unpack_from(body, length)
            if crc != expected:
                error = (self._corrupt(offset, f"the checksum of the {length}-byte record does not match"), offset)
                break
            self._ready.append((bytes(data), offset + _HEADER.size + length + _FOOTER.size))
        if error is not None:
            self._ready.append(error)

    def __next__(self) -> bytes:
        self._assert_not_closed()
        if not self._ready:
            self._read_block()
            if not self._ready:
                raise StopIteration
        value, offset = self._ready[0]
        if isinstance(value, CorruptRecordError):
            # Stays at the bad record: a later next() raises again.
            self._offset = offset
            raise value
        self._ready.popleft()
        self._offset = offset
        return value

    def get_state(self) -> dict:
        self._assert_not_closed()
        return {"reader_offset": self._offset}

    def set_state(self, state: dict) -> None:
        self._assert_not_closed()
        require_keys(state, self, ("reader_offset",))
        offset = non_negative_int(state, "reader_offset", self)
        self._file.seek(offset)
        self._offset = offset
        self._ready.clear()
        self._block = _FIRST_BLOCK

    def close(self) -> None:
        """Closes the file."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        if self._file is not None:
            self._file.close()
            self._file = None
        self._ready.clear()

    def __str__(self) -> str:
        return f"TFRecordDatasetIterator(path={self._path!r})"


def _data_crcs(datas: list) -> list:
    """The masked CRC-32C of each record's data.

    Short records of similar lengths are checked together (``crc32c_many`` costs
    as much as its longest record), long ones one by one (chunked in numpy).
    """
    out: list = [None] * len(datas)
    groups: dict = {}
    for i, d in enumerate(datas):
        if len(d) >= _ALONE_BYTES:
            out[i] = masked_crc32c(d)
        else:
            groups.setdefault(len(d).bit_length(), []).append(i)
    for members in groups.values():
        if len(members) < _MIN_GROUP:
            for i in members:
                out[i] = masked_crc32c(datas[i])
            continue
        crcs = masked(crc32c_many([datas[i] for i in members])).tolist()
        for i, crc in zip(members, crcs):
            out[i] = crc
    return out


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
