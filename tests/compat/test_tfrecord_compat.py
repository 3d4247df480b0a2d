"""``TFRecordIterDataset`` against grain 0.2.18, on files written by TensorFlow and by grainlike's writer.

The framing is checked against the format (length, masked CRC-32C of the length,
data, masked CRC-32C of the data); grain reads the same file to the same records
and states, and the states restore across the libraries.
"""

import struct

import numpy as np
import pytest

from grainlike.dataset.conformance import assert_equal_output_after_checkpoint
from grainlike.sources.formats.crc32c_checksum import masked_crc32c
from grainlike.dataset.sources.tfrecord import CorruptRecordError, TFRecordIterDataset, write_tfrecords
from tests.compat.dataset_pairs import GRAINLIKE, check_pipeline, grain_namespace
from tests.compat.experimental_pairs import experimental

RECORDS = [b"", b"a", b"hello tfrecord", bytes(range(256)) * 20, b"\x00" * 5000, b"last"]


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "data.tfrecord"
    write_tfrecords(p, RECORDS)
    return str(p)


def test_writer_frames_records_as_the_format_says(path):
    raw = open(path, "rb").read()
    offset = 0
    for record in RECORDS:
        length, length_crc = struct.unpack_from("<QI", raw, offset)
        assert length == len(record)
        assert length_crc == masked_crc32c(raw[offset : offset + 8])
        data = raw[offset + 12 : offset + 12 + length]
        assert data == record
        (data_crc,) = struct.unpack_from("<I", raw, offset + 12 + length)
        assert data_crc == masked_crc32c(record)
        offset += 16 + length
    assert offset == len(raw)


def test_a_file_written_by_tensorflow_reads_with_both_checksums_verified(grain_ref, tmp_path):
    # grain's own test file, written by TensorFlow's TFRecord writer: the first
    # five terms of the look-and-say (Morris) sequence.
    import pathlib

    import grain

    written = pathlib.Path(grain.__file__).parent / "_src/python/testdata/morris_sequence_first_5.tfrecord"
    expected = [b"1", b"1 1", b"2 1", b"1 2 1 1", b"1 1 1 2 2 1"]
    assert list(TFRecordIterDataset(written)) == expected
    # grainlike's writer makes the same bytes.
    ours = tmp_path / "ours.tfrecord"
    write_tfrecords(ours, expected)
    assert ours.read_bytes() == written.read_bytes()


def test_records_and_states_match_reference(grain_ref, path):
    def build(lib):
        return experimental(lib).TFRecordIterDataset(path)

    assert check_pipeline(build, grain_namespace(grain_ref)) == RECORDS


def test_records_through_a_pipeline_match_reference(grain_ref, path):
    def build(lib):
        return experimental(lib).TFRecordIterDataset(path).map(len).batch(4)

    values = check_pipeline(build, grain_namespace(grain_ref))
    assert [v.tolist() for v in values] == [[0, 1, 14, 5120], [5000, 4]]


def test_many_records_of_mixed_lengths_match_reference(grain_ref, tmp_path):
    # Blocks of records are checked together: short records of similar lengths at
    # once, long ones alone. States and restores fall inside and across blocks.
    rng = np.random.default_rng(0)
    lengths = rng.choice([0, 1, 7, 100, 900, 3000, 5000], size=700)
    records = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in lengths]
    p = str(tmp_path / "many.tfrecord")
    write_tfrecords(p, records)

    def build(lib):
        return experimental(lib).TFRecordIterDataset(p)

    assert check_pipeline(build, grain_namespace(grain_ref)) == records


def test_records_longer_than_a_block_match_reference(grain_ref, tmp_path):
    # The first block is 64 KiB: a longer record is read alone, after its length
    # is checked; smaller ones around it come in blocks.
    records = [b"a", bytes(range(256)) * 800, b"b" * 70_000, b"", b"c" * 65_000, b"d"]
    p = str(tmp_path / "long.tfrecord")
    write_tfrecords(p, records)

    def build(lib):
        return experimental(lib).TFRecordIterDataset(p)

    assert check_pipeline(build, grain_namespace(grain_ref)) == records


@pytest.mark.parametrize("corrupt", ["length", "data"])
def test_a_corrupt_record_past_the_first_block_is_reached_in_order(tmp_path, corrupt):
    records = [bytes([i % 256]) * 1000 for i in range(300)]  # ~300 KB: several blocks.
    p = tmp_path / "deep.tfrecord"
    write_tfrecords(p, records)
    raw = bytearray(p.read_bytes())
    bad = 200
    offset = bad * 1016
    raw[offset + (1 if corrupt == "length" else 500)] ^= 0x40
    p.write_bytes(bytes(raw))
    it = iter(TFRecordIterDataset(p))
    assert [next(it) for _ in range(bad)] == records[:bad]
    with pytest.raises(CorruptRecordError, match=f"at byte {offset}: the {'length' if corrupt == 'length' else 'checksum'}"):
        next(it)
    assert it.get_state() == {"reader_offset": offset}
    it.set_state({"reader_offset": offset + 1016})  # Past it, the file reads on.
    assert list(it) == records[bad + 1 :]


def test_a_truncated_long_record_raises_value_error(tmp_path):
    p = tmp_path / "cut.tfrecord"
    write_tfrecords(p, [b"x", b"y" * 100_000])
    p.write_bytes(p.read_bytes()[:-10])
    it = iter(TFRecordIterDataset(p))
    assert next(it) == b"x"
    with pytest.raises(CorruptRecordError, match="at byte 17: the record of 100000 bytes is truncated"):
        next(it)


def test_tfrecord_restores_at_every_step(path):
    assert_equal_output_after_checkpoint(TFRecordIterDataset(path))


def test_a_flipped_data_byte_fails_the_checksum(path):
    raw = bytearray(open(path, "rb").read())
    raw[12 + 0 + 4 + 12 + 1 + 4 + 12 + 3] ^= 1  # A byte of the third record's data.
    with open(path, "wb") as f:
        f.write(raw)
    it = iter(TFRecordIterDataset(path))
    assert next(it) == b"" and next(it) == b"a"
    with pytest.raises(CorruptRecordError, match=r"data\.tfrecord at byte 33: the checksum"):
        next(it)
    assert it.get_state() == {"reader_offset": 33}
    with pytest.raises(CorruptRecordError):  # It stays at the corrupt record.
        next(it)


def test_a_corrupt_length_fails_before_reading_the_data(path):
    raw = bytearray(open(path, "rb").read())
    raw[2] ^= 0xFF
    with open(path, "wb") as f:
        f.write(raw)
    with pytest.raises(CorruptRecordError, match="the length's checksum"):
        next(iter(TFRecordIterDataset(path)))


@pytest.mark.parametrize("cut", [5, 20])
def test_a_truncated_file_raises_value_error_as_reference(grain_ref, path, cut):
    raw = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(raw[: 16 + 17 + cut])  # Two whole records, then part of the third.
    for lib in (grain_namespace(grain_ref), GRAINLIKE):
        it = iter(experimental(lib).TFRecordIterDataset(path))
        assert [next(it), next(it)] == [b"", b"a"]
        with pytest.raises(ValueError, match="Not a valid TFRecord"):
            next(it)


def test_a_missing_file_raises_file_not_found_as_reference(grain_ref, tmp_path):
    for lib in (grain_namespace(grain_ref), GRAINLIKE):
        with pytest.raises(FileNotFoundError):
            iter(experimental(lib).TFRecordIterDataset(str(tmp_path / "absent.tfrecord")))


def test_records_of_arrays_are_written_as_their_bytes(tmp_path):
    p = tmp_path / "arrays.tfrecord"
    arrays = [np.arange(i, dtype=np.int32) for i in range(4)]
    write_tfrecords(p, arrays)
    got = [np.frombuffer(r, np.int32) for r in TFRecordIterDataset(p)]
    assert [g.tolist() for g in got] == [a.tolist() for a in arrays]
    with pytest.raises(TypeError, match="record 1 is not bytes-like"):
        write_tfrecords(p, [b"x", "text"])
