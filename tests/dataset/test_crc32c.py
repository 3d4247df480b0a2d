"""CRC-32C against the published test vectors, and its two paths against each other."""

import os

import numpy as np
import pytest

from grainlike.dataset.crc32c import NUMPY_MIN, crc32c, crc32c_many, masked, masked_crc32c


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"123456789", 0xE3069283),  # The check value of the CRC-32C parameters.
        (bytes(32), 0x8A9136AA),  # RFC 3720 (iSCSI), appendix B.4.
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
        (b"", 0),
    ],
)
def test_crc32c_matches_published_vectors(data, expected):
    assert crc32c(data) == expected


def test_masked_crc_of_nothing_is_the_mask_constant():
    # TFRecord's mask: rotate right by 15 bits, add 0xA282EAD8.
    assert masked_crc32c(b"") == 0xA282EAD8
    crc = 0xE3069283
    assert masked_crc32c(b"123456789") == ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


@pytest.mark.parametrize("length", [NUMPY_MIN - 1, NUMPY_MIN, NUMPY_MIN + 33, 5000, 65536 + 7, 300_001])
def test_numpy_lanes_equal_the_byte_loop_and_continue(length):
    data = os.urandom(length)
    whole = crc32c(data)
    # The byte loop alone: continue over pieces shorter than the numpy threshold.
    value = 0
    for start in range(0, length, 1000):
        value = crc32c(data[start : start + 1000], value)
    assert whole == value


def test_many_records_together_equal_each_alone():
    rng = np.random.default_rng(1)
    records = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in rng.integers(0, 300, 200)]
    records += [b"", b"1", b"123456789", bytes(32)]
    got = crc32c_many(records)
    assert got.dtype == np.uint32
    assert got.tolist() == [crc32c(r) for r in records]
    assert got[-2:].tolist() == [0xE3069283, 0x8A9136AA]
    assert masked(got).tolist() == [masked_crc32c(r) for r in records]
    assert crc32c_many([]).tolist() == []
