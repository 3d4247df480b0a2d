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

import numpy as np

from grainlike.dataset.base import DatasetIterator, IterDataset
from grainlike.dataset.crc32c import crc32c_many, masked, masked_crc32c
from grainlike.dataset.state import non_negative_int, require_keys

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
# Bytes read at once: the first block is small, so the first record comes soon;
# each next one twice as large, up to _BLOCK_BYTES and _BLOCK_RECORDS records.
_FIRST_CHUNK = 64 << 10
_BLOCK_BYTES = 4 << 20
_BLOCK_RECORDS = 1024
# Records at least this long get their checksum alone (in numpy lanes); shorter
# ones of similar lengths together, when at least _MIN_GROUP of them are (a
# crc32c_many step costs about as much as 25 bytes of the byte loop).
_ALONE_BYTES = 16384
_MIN_GROUP = 16


class CorruptRecordError(ValueError):
    """A TFRecord file is truncated or a record's checksum does not match."""


class _TFRecordDatasetIterator(DatasetIterator):
    """Reads one TFRecord file from start to end; see the module docstring.

    Records are read in blocks (64 KiB at first, doubling to ``_BLOCK_BYTES``)
    whose checksums are verified together (``crc32c_many``); an error found in
    a block is raised when the iteration reaches the record that has it.
    """

    def __init__(self, path: Union[str, os.PathLike]):
        super().__init__()
        self._path = os.fspath(path)
        self._file: Optional[BinaryIO] = open(self._path, "rb")
        self._offset = 0  # Of the next record returned.
        # (data, offset after it), or (CorruptRecordError, offset of its record).
        self._ready: collections.deque = collections.deque()
        self._read_at = 0  # Where the next block starts.
        self._chunk = _FIRST_CHUNK

    def _corrupt(self, offset: int, what: str) -> CorruptRecordError:
        return CorruptRecordError(f"Not a valid TFRecord: {self._path} at byte {offset}: {what}")

    def _read_block(self) -> None:
        """Reads the next block of records into ``_ready``, checked; nothing at the end.

        The block's bytes are read at once and parsed in memory; the lengths'
        checksums are then verified together, before any length is used beyond
        the block (a record longer than the block is read alone, after its
        length's checksum).
        """
        f = self._file
        base = self._read_at
        f.seek(base)
        want = self._chunk
        self._chunk = min(self._chunk * 2, _BLOCK_BYTES)
        buf = f.read(want)
        at_end = len(buf) < want
        pos = 0
        records: list = []  # (offset, length, bytes holding the data, where it starts)
        headers: list = []
        length_crcs: list = []
        error = None
        while len(records) < _BLOCK_RECORDS:
            left = len(buf) - pos
            if left < _HEADER.size:
                if at_end and left:
                    what = f"fewer than {_HEADER.size} bytes of header: {buf[pos:].hex()}"
                    error = (self._corrupt(base + pos, what), base + pos)
                break  # At the end, or the header goes on in the next block.
            length, length_crc = _HEADER.unpack_from(buf, pos)
            end = pos + _HEADER.size + length + _FOOTER.size
            if end > len(buf):
                if records:
                    break  # The next block starts with it.
                # The block's first record does not fit in it: its length is
                # checked before it is read whole.
                if masked_crc32c(buf[pos : pos + 8]) != length_crc:
                    error = (self._length_error(base + pos, length), base + pos)
                    break
                body = buf[pos + _HEADER.size :] + f.read(end - len(buf))
                if len(body) != length + _FOOTER.size:
                    what = f"the record of {length} bytes is truncated ({len(body)} of {length + 4} bytes left)"
                    error = (self._corrupt(base + pos, what), base + pos)
                    break
                records.append((base + pos, length, body, 0))
                pos = end
                break
            headers.append(buf[pos : pos + 8])
            length_crcs.append(length_crc)
            records.append((base + pos, length, buf, pos + _HEADER.size))
            pos = end
        if headers:
            bad = np.flatnonzero(masked(crc32c_many(headers)) != np.array(length_crcs, np.uint64))
            if len(bad):
                k = int(bad[0])
                offset, length = records[k][0], records[k][1]
                error = (self._length_error(offset, length), offset)
                records = records[:k]
        self._read_at = base + pos
        datas = [memoryview(source)[start : start + length] for _, length, source, start in records]
        crcs = _data_crcs(datas)
        for (offset, length, source, start), data, crc in zip(records, datas, crcs):
            (expected,) = _FOOTER.unpack_from(source, start + length)
            if crc != expected:
                error = (self._corrupt(offset, f"the checksum of the {length}-byte record does not match"), offset)
                break
            self._ready.append((bytes(data), offset + _HEADER.size + length + _FOOTER.size))
        if error is not None:
            self._ready.append(error)

    def _length_error(self, offset: int, length: int) -> CorruptRecordError:
        return self._corrupt(offset, f"the length's checksum does not match (length field {length})")

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
        self._offset = self._read_at = offset
        self._ready.clear()
        self._chunk = _FIRST_CHUNK

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
