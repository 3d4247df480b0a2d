"""TFRecord files: reading and writing records, with their checksums, without TensorFlow.

A TFRecord file is a sequence of records, each framed as::

    uint64 length (little-endian)
    uint32 masked CRC-32C of the 8 length bytes
    byte   data[length]
    uint32 masked CRC-32C of the data

Both CRCs are checked before a record is returned. ``TFRecordFile`` reads a local
file fast; ``_TFRecordReader`` reads any binary file object (grain's reader, which
subclasses may feed).
"""

from __future__ import annotations

import collections
import os
import struct
from typing import Any, BinaryIO, Iterable, Optional, Union

import numpy as np

from grainlike.core.errors import ClosedIteratorError, CorruptRecordError
from grainlike.sources.formats.crc32c_checksum import crc32c_many, masked, masked_crc32c

__all__ = ["CorruptRecordError", "TFRecordFile", "write_tfrecords"]

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_FRAME = _HEADER.size + _FOOTER.size
# Bytes read at once: the first block is small, so the first record comes soon;
# each next one twice as large, up to _MAX_CHUNK (small enough for the block to
# stay in the CPU's cache while its records are cut out and checked).
_FIRST_CHUNK = 64 << 10
_MAX_CHUNK = 512 << 10
# Records at least this long are read alone, straight into their own bytes
# (one copy instead of two: into the block, then out of it), when next() comes
# to them, so that only the record returned is in memory (and in the cache).
_ALONE_BYTES = 16 << 10
# Length fields whose checksums were verified, remembered per iterator: most
# files repeat a few lengths, and a look-up costs a fraction of a checksum.
_KNOWN_LENGTHS = 4096
# Blocks of fewer records are checked one record at a time: numpy's fixed
# cost is then larger than the loop's.
_FEW_RECORDS = 8
# After two records of the same length, the records that follow with that
# length are found in numpy (_extend_run), in files of fixed-size records most
# of a block at once. A try that finds fewer than _RUN_MIN records is a miss;
# after _RUN_TRIES misses a block stops trying.
_RUN_MIN = 8
_RUN_TRIES = 4


class _TFRecordReader:
    """grain's reader protocol over a binary file object ``self._reader``.

    ``__next__`` returns the next record's data (both checksums verified),
    ``seek(offset)`` and ``tell()`` move and report the byte offset of the next
    record. A subclass may skip this ``__init__`` and set ``self._reader`` to any
    binary file-like object with ``read``, ``seek`` and ``tell`` (MaxText reads
    from GCS this way), as with grain's ``_TFRecordReader``.
    """

    def __init__(self, path: Union[str, os.PathLike]):
        self._reader: BinaryIO = open(path, "rb")

    def _corrupt(self, offset: int, what: str) -> CorruptRecordError:
        name = getattr(self._reader, "name", None) or type(self._reader).__name__
        return CorruptRecordError(f"Not a valid TFRecord: {name} at byte {offset}: {what}")

    def __next__(self) -> bytes:
        reader = self._reader
        offset = reader.tell()
        header = reader.read(_HEADER.size)
        if not header:
            raise StopIteration
        if len(header) != _HEADER.size:
            raise self._corrupt(offset, f"fewer than {_HEADER.size} bytes of header: {header.hex()}")
        length, length_crc = _HEADER.unpack(header)
        if masked_crc32c(header[:8]) != length_crc:
            raise self._corrupt(offset, f"the length's checksum does not match (length field {length})")
        body = reader.read(length + _FOOTER.size)
        if len(body) != length + _FOOTER.size:
            raise self._corrupt(
                offset, f"the record of {length} bytes is truncated ({len(body)} of {length + 4} bytes left)"
            )
        data = body[:length]
        if masked_crc32c(data) != _FOOTER.unpack_from(body, length)[0]:
            raise self._corrupt(offset, f"the checksum of the {length}-byte record does not match")
        return data

    def __iter__(self) -> "_TFRecordReader":
        return self

    def seek(self, offset: int) -> None:
        self._reader.seek(offset)

    def tell(self) -> int:
        return self._reader.tell()

    def close(self) -> None:
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # pylint: disable=broad-except
            pass


class TFRecordFile:
    """The records of one local TFRecord file, from start to end: grain's reader protocol (see ``_TFRecordReader``).

    Short records are read in blocks (64 KiB at first, doubling to
    ``_MAX_CHUNK``) with ``os.pread`` and cut out of them; long ones
    (``_ALONE_BYTES`` or more) are read alone, one per ``next()``, straight
    into their bytes. A block is verified whole before its first record is
    returned; an error found in it is raised when the iteration reaches the
    record that has it.
    """

    def __init__(self, path: Union[str, os.PathLike]):
        self._path = os.fspath(path)
        self._file: Optional[BinaryIO] = open(self._path, "rb", buffering=0)
        self._fd = self._file.fileno()
        self._known: dict = {}  # Short length field -> its masked CRC, verified.
        self._long_header = b""  # The last header verified after a record read alone.
        self._size = os.fstat(self._fd).st_size  # Measured again when a record seems cut.
        self._start_block(0)

    def _start_block(self, offset: int) -> None:
        """Empties the block: the next ``next()`` reads from ``offset``."""
        self._set_block(offset, [], [], offset, None, _FIRST_CHUNK, None)

    def _set_block(
        self,
        base: int,
        starts: list,
        records: list,
        end: int,
        error: Optional[CorruptRecordError],
        chunk: int,
        alone: Optional[int],
    ) -> None:
        self._base = base  # Where the block was read from.
        self._starts = starts  # Each record's offset from base.
        # Records not returned yet: a record returned is no longer held here.
        self._records = collections.deque(records)
        self._take = self._records.popleft
        self._end = end  # Just after the block's last record: where the next block starts.
        self._error = error  # Raised after the records.
        self._chunk = chunk  # Bytes the next block reads.
        # The verified length field of the record at end if it is to be read alone.
        self._alone = alone

    def _corrupt(self, offset: int, what: str) -> CorruptRecordError:
        return CorruptRecordError(f"Not a valid TFRecord: {self._path} at byte {offset}: {what}")

    def _checksum_error(self, offset: int, length: int) -> CorruptRecordError:
        return self._corrupt(offset, f"the checksum of the {length}-byte record does not match")

    def __next__(self) -> bytes:
        try:
            return self._take()
        except IndexError:  # The block is done.
            return self._next_block()

    def _next_block(self) -> bytes:
        if self._file is None:
            raise ClosedIteratorError(f"Trying to advance a closed iterator: '{self}'.")
        if self._error is None and self._alone is None:
            self._read_block()
            try:
                return self._take()
            except IndexError:
                pass
        if self._error is None and self._alone is not None:
            return self._read_alone()
        if self._error is not None:
            raise self._error  # The state stays at the bad record: it raises again.
        raise StopIteration

    def _read_block(self) -> None:
        """Reads the records after the current block into a new block, verified.

        The block's bytes are read at once and its records cut out of them; a
        length field is verified before it is used, the records' data together
        at the end. A long record (and any that does not fit the block first)
        is read alone after them. The first error ends the block.
        """
        base = self._end
        chunk = self._chunk
        buf = os.pread(self._fd, chunk, base)
        size = len(buf)
        known = self._known
        unpack = _HEADER.unpack_from
        starts: list = []
        records: list = []
        pos = 0
        length = previous = -1
        tries = _RUN_TRIES
        error = None
        alone = False  # Whether the record at pos is read on its own.
        while pos + _HEADER.size <= size:
            length, length_crc = unpack(buf, pos)
            if known.get(length) != length_crc:
                # Long lengths are never remembered, so they all come here.
                if masked_crc32c(buf[pos : pos + 8]) != length_crc:
                    error = self._corrupt(base + pos, f"the length's checksum does not match (length field {length})")
                    break
                if length >= _ALONE_BYTES:
                    alone = True
                    break
                if len(known) >= _KNOWN_LENGTHS:
                    known.clear()
                known[length] = length_crc
            end = pos + length + _FRAME
            if end > size:
                # A record that does not fit starts the next block, unless it is the first.
                alone = not records
                break
            starts.append(pos)
            records.append(buf[pos + _HEADER.size : end - _FOOTER.size])
            pos = end
            if length == previous and tries:
                after = _extend_run(buf, pos, length, length_crc, starts, records)
                if after - pos < _RUN_MIN * (length + _FRAME):
                    tries -= 1
                pos = after
            previous = length
        else:
            if not records and pos < size:
                what = f"fewer than {_HEADER.size} bytes of header: {buf[pos:].hex()}"
                error = self._corrupt(base + pos, what)
        if records:
            bad = _first_bad_checksum(records, starts, pos, buf)
            if bad is not None:
                pos = starts[bad]
                error = self._checksum_error(base + pos, len(records[bad]))
                del starts[bad:], records[bad:]
                alone = False
        self._set_block(base, starts, records, base + pos, error, min(chunk * 2, _MAX_CHUNK), length if alone else None)

    def _read_alone(self) -> bytes:
        """Reads the record at the end of the (returned) block, whose length field is verified, into its bytes.

        Its footer is read with the next header: a long record after it is read
        alone too, a short one starts a block just large enough for it and the
        header after it (so that little is read twice).
        """
        fd = self._fd
        offset = self._end
        length, self._alone = self._alone, None
        data_at = offset + _HEADER.size
        error = None
        if data_at + length + _FOOTER.size > self._size:
            self._size = os.fstat(fd).st_size  # The file may have grown.
            left = self._size - data_at
            if left < length + _FOOTER.size:
                # Checked before reading: a length field may ask for more memory than there is.
                what = f"the record of {length} bytes is truncated ({max(left, 0)} of {length + 4} bytes left)"
                error = self._corrupt(offset, what)
        if error is None:
            data = os.pread(fd, length, data_at)
            tail = os.pread(fd, _FOOTER.size + _HEADER.size, data_at + length)  # Footer, next header.
            if len(data) < length or len(tail) < _FOOTER.size:  # Cut since it was measured.
                got = len(data) + len(tail)
                what = f"the record of {length} bytes is truncated ({got} of {length + 4} bytes left)"
                error = self._corrupt(offset, what)
            elif masked_crc32c(data) != _FOOTER.unpack_from(tail)[0]:
                error = self._checksum_error(offset, length)
        if error is not None:
            self._error = error
            self._take = self._records.popleft  # Empty: next() goes to _next_block, which raises it.
            raise error
        self._end = data_at + length + _FOOTER.size
        self._chunk = _FIRST_CHUNK  # Unless the next header says better, below.
        header = tail[_FOOTER.size :]
        if len(header) == _HEADER.size:
            length, length_crc = _HEADER.unpack(header)
            # A header that fails its check is left to the next block to report.
            if header == self._long_header or masked_crc32c(header[:8]) == length_crc:
                self._long_header = header
                if length >= _ALONE_BYTES:
                    self._alone = length
                else:
                    self._chunk = length + _FRAME + _HEADER.size
        # Long records after long records: next() comes straight here.
        self._take = self._read_alone if self._alone is not None else self._records.popleft
        return data

    def __iter__(self) -> "TFRecordFile":
        return self

    def tell(self) -> int:
        """The byte offset of the next record."""
        done = len(self._starts) - len(self._records)
        return self._base + self._starts[done] if done < len(self._starts) else self._end

    def seek(self, offset: int) -> None:
        """The next record is the one at byte ``offset``."""
        self._start_block(offset)

    def close(self) -> None:
        """Closes the file (idempotent)."""
        file, self._file = getattr(self, "_file", None), None  # None if open() failed.
        if file is not None:
            file.close()
        self._start_block(0)

    def __str__(self) -> str:
        return f"TFRecordFile(path={self._path!r})"


def _extend_run(buf: bytes, pos: int, length: int, length_crc: int, starts: list, records: list) -> int:
    """Appends the records from ``pos`` on that repeat the header ``(length, length_crc)``; returns where they end.

    A record whose header equals one verified before has the same length, so
    the next record starts ``length + 16`` bytes later: the headers at that
    stride are compared in numpy, up to the first that differs or does not fit.
    """
    stride = length + _FRAME
    count = (len(buf) - pos) // stride
    if count == 0:
        return pos
    lengths = np.ndarray((count,), dtype="<u8", buffer=buf, offset=pos, strides=(stride,))
    crcs = np.ndarray((count,), dtype="<u4", buffer=buf, offset=pos + 8, strides=(stride,))
    same = (lengths == length) & (crcs == length_crc)
    count = count if same.all() else int(same.argmin())
    stop = pos + count * stride
    starts.extend(range(pos, stop, stride))
    data = pos + _HEADER.size
    records.extend(map(buf.__getitem__, map(slice, range(data, stop, stride), range(data + length, stop, stride))))
    return stop


def _first_bad_checksum(records: list, starts: list, end: int, buf: bytes) -> Optional[int]:
    """The index of the first of ``records`` (at ``starts`` in ``buf``, the last ending at ``end``) with a bad CRC."""
    if len(records) < _FEW_RECORDS:
        for i, (start, record) in enumerate(zip(starts, records)):
            if masked_crc32c(record) != _FOOTER.unpack_from(buf, start + _HEADER.size + len(record))[0]:
                return i
        return None
    crcs = masked(crc32c_many(records))
    # Each footer: the 4 little-endian bytes before the next record.
    at = np.array(starts[1:] + [end], dtype=np.int64)[:, None] + np.arange(-_FOOTER.size, 0)
    footers = np.frombuffer(buf, dtype=np.uint8)[at].view("<u4")[:, 0]
    bad = np.flatnonzero(crcs != footers)
    return int(bad[0]) if len(bad) else None


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
