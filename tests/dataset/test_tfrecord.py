"""``TFRecordIterDataset``: every way a record is read, checked, and reported when corrupt.

Short records are cut out of blocks (runs of equal lengths found in numpy),
long ones read alone; each pattern below crosses those paths and their
boundaries. Files are built here from the format's definition, with a CRC-32C
computed from its definition, independently of grainlike's writer.
"""

import struct

import numpy as np
import pytest

from grainlike.core.errors import ClosedIteratorError
from grainlike.sources.formats import crc32c_checksum as crc_module
from grainlike.sources.formats import tfrecord_files
from grainlike.dataset.sources.tfrecord import CorruptRecordError, TFRecordIterDataset, write_tfrecords

ALONE = tfrecord_files._ALONE_BYTES


def _table() -> list:
    """The byte table of CRC-32C, built bit by bit from its definition (reflected polynomial 0x82F63B78)."""
    table = []
    for byte in range(256):
        register = byte
        for _ in range(8):
            register = (register >> 1) ^ (0x82F63B78 if register & 1 else 0)
        table.append(register)
    return table


TABLE = _table()


def _crc32c(data: bytes) -> int:
    register = 0xFFFFFFFF
    for byte in data:
        register = TABLE[(register ^ byte) & 0xFF] ^ (register >> 8)
    return register ^ 0xFFFFFFFF


def _mask(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _frame(data: bytes) -> bytes:
    """One TFRecord record, from the format's definition."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", _mask(_crc32c(length))) + data + struct.pack("<I", _mask(_crc32c(data)))


def _offsets(records: list) -> list:
    """The byte offset of each record and of the end."""
    return np.concatenate([[0], np.cumsum([len(r) + 16 for r in records])]).tolist()


def _records(lengths: list, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [rng.bytes(int(n)) for n in lengths]


PATTERNS = {
    # Fixed-size runs (found in numpy), broken by other lengths, across blocks.
    "runs": [200] * 700 + [7] + [200] * 300 + [0] * 40 + [5000] * 30,
    "varied_short": np.random.default_rng(1).integers(0, 3000, 500).tolist(),
    # Long records alone, one after another, and short ones between them.
    "long_runs": [ALONE] * 40 + [ALONE - 1] * 3 + [100_000] * 12 + [3, 9] + [300_000] * 4 + [1],
    "alternating": [v for _ in range(30) for v in (50, 2 * ALONE, 900)],
    # A short record that does not fit the first 64 KiB block.
    "straddling": [60_000, 10_000, 10_000] + [15_000] * 10,
    "empty": [],
    "empty_records": [0] * 300,
}


@pytest.fixture(params=["google-crc32c", "numpy"])
def impl(request, monkeypatch):
    if request.param == "numpy":
        monkeypatch.setattr(crc_module, "_C", None)
    return request.param


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_records_states_and_restores_follow_the_format(tmp_path, impl, pattern):
    records = _records(PATTERNS[pattern])
    path = tmp_path / "f.tfrecord"
    path.write_bytes(b"".join(_frame(r) for r in records))
    offsets = _offsets(records)

    it = iter(TFRecordIterDataset(path))
    states = [it.get_state()]
    for record in records:
        assert next(it) == record
        states.append(it.get_state())
    with pytest.raises(StopIteration):
        next(it)
    assert it.get_state() == {"reader_offset": offsets[-1]}
    assert states == [{"reader_offset": o} for o in offsets]

    for k in range(0, len(records), max(1, len(records) // 25)):
        restored = iter(TFRecordIterDataset(path))
        restored.set_state(states[k])
        assert next(restored) == records[k]
        assert restored.get_state() == states[k + 1]
    if records:
        restored.set_state(states[len(records) // 2])
        assert list(restored) == records[len(records) // 2 :]


def test_writer_writes_the_formats_bytes(tmp_path):
    records = _records([0, 1, 200, ALONE + 5])
    path = tmp_path / "w.tfrecord"
    write_tfrecords(path, records)
    assert path.read_bytes() == b"".join(_frame(r) for r in records)


def _corrupt_at(path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x10
    path.write_bytes(bytes(raw))


# (pattern, record index, byte within the record's frame, what the error says)
CORRUPTIONS = [
    ("runs", 500, 12 + 100, "the checksum of the 200-byte record"),  # data, inside a run
    ("runs", 500, 12 + 200 + 2, "the checksum of the 200-byte record"),  # data's checksum
    ("runs", 500, 3, "the length's checksum does not match (length field"),  # length, inside a run
    ("runs", 500, 9, "the length's checksum does not match (length field 200)"),  # length's checksum
    ("varied_short", 300, 12, "-byte record does not match"),
    ("long_runs", 0, 12 + 5, f"the checksum of the {ALONE}-byte record"),
    ("long_runs", 20, 12 + ALONE - 1, f"the checksum of the {ALONE}-byte record"),
    ("long_runs", 21, 1, "the length's checksum"),  # the header read after a long record
    ("long_runs", 50, 12 + 99_999, "the checksum of the 100000-byte record"),
    ("alternating", 31, 12 + 7, f"the checksum of the {2 * ALONE}-byte record"),
    ("alternating", 32, 4, "the length's checksum"),
    ("straddling", 1, 12 + 9_999, "the checksum of the 10000-byte record"),
]


@pytest.mark.parametrize("pattern, index, at, what", CORRUPTIONS)
def test_a_corrupt_record_is_reported_in_order_and_reading_goes_on_past_it(tmp_path, pattern, index, at, what):
    records = _records(PATTERNS[pattern])
    path = tmp_path / "bad.tfrecord"
    write_tfrecords(path, records)
    offsets = _offsets(records)
    _corrupt_at(path, offsets[index] + at)

    it = iter(TFRecordIterDataset(path))
    assert [next(it) for _ in range(index)] == records[:index]
    for _ in range(2):  # It stays at the bad record.
        with pytest.raises(CorruptRecordError, match=f"bad.tfrecord at byte {offsets[index]}: ") as info:
            next(it)
        assert what in str(info.value)
        assert it.get_state() == {"reader_offset": offsets[index]}
    it.set_state({"reader_offset": offsets[index + 1]})
    assert list(it) == records[index + 1 :]


def test_a_length_beyond_the_file_is_truncation_not_an_allocation(tmp_path):
    # A length field with a valid checksum that asks for a terabyte.
    length = struct.pack("<Q", 1 << 40)
    header = length + struct.pack("<I", _mask(_crc32c(length)))
    path = tmp_path / "huge.tfrecord"
    path.write_bytes(_frame(b"x") + header + b"abc")
    it = iter(TFRecordIterDataset(path))
    assert next(it) == b"x"
    with pytest.raises(CorruptRecordError, match=rf"at byte 17: the record of {1 << 40} bytes is truncated \(3 of"):
        next(it)


@pytest.mark.parametrize("cut", [1, 4, 5000, ALONE + 3])
def test_a_file_cut_inside_a_long_record_says_how_much_is_left(tmp_path, cut):
    records = _records([10, 3 * ALONE, 10])
    path = tmp_path / "cut.tfrecord"
    write_tfrecords(path, records)
    end_of_long = _offsets(records)[2]
    path.write_bytes(path.read_bytes()[: end_of_long - cut])
    it = iter(TFRecordIterDataset(path))
    assert next(it) == records[0]
    left = 3 * ALONE + 4 - cut
    with pytest.raises(CorruptRecordError, match=rf"at byte 26: the record of {3 * ALONE} bytes is truncated \({left} of"):
        next(it)


def test_a_file_growing_between_reads_is_read_to_its_new_end(tmp_path):
    records = _records([30, 2 * ALONE, 30])
    path = tmp_path / "grow.tfrecord"
    path.write_bytes(_frame(records[0]))
    it = iter(TFRecordIterDataset(path))
    assert list(it) == records[:1]
    with open(path, "ab") as f:
        f.write(b"".join(_frame(r) for r in records[1:]))
    assert list(it) == records[1:]


def test_a_closed_iterator_refuses_to_go_on(tmp_path):
    path = tmp_path / "c.tfrecord"
    write_tfrecords(path, [b"a", b"b"])
    it = iter(TFRecordIterDataset(path))
    assert next(it) == b"a"
    it.close()
    with pytest.raises(ClosedIteratorError, match="TFRecordDatasetIterator"):
        next(it)
    with pytest.raises(ClosedIteratorError):
        it.get_state()
    it.close()  # Idempotent.
