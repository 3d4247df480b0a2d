"""CRC-32C against the published test vectors, in both implementations.

``google-crc32c`` (C) computes the checksums; the numpy code is the fallback
where its C extension cannot be imported. Every vector runs through both: the
``impl`` fixture switches the module to numpy as a missing library would.
"""

import os
import subprocess
import sys
import types

import numpy as np
import pytest

from grainlike.sources.formats import crc32c_checksum as crc_module
from grainlike.sources.formats.crc32c_checksum import NUMPY_MIN, crc32c, crc32c_many, masked, masked_crc32c

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# RFC 3720 (iSCSI), appendix B.4, and the check value of the CRC-32C parameters.
VECTORS = [
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (b"", 0),
]


def _bitwise_crc32c(data: bytes) -> int:
    """CRC-32C one bit at a time, straight from its definition (reflected polynomial 0x82F63B78)."""
    register = 0xFFFFFFFF
    for byte in data:
        register ^= byte
        for _ in range(8):
            register = (register >> 1) ^ (0x82F63B78 if register & 1 else 0)
    return register ^ 0xFFFFFFFF


@pytest.fixture(params=["google-crc32c", "numpy"])
def impl(request, monkeypatch):
    if request.param == "numpy":
        monkeypatch.setattr(crc_module, "_C", None)
    return request.param


def test_the_compiled_library_is_in_use():
    # google-crc32c is a dependency: with its wheel installed, nothing falls back.
    assert crc_module.IMPLEMENTATION == "google-crc32c"
    assert crc_module._C.implementation == "c"


@pytest.mark.parametrize("data, expected", VECTORS)
def test_crc32c_matches_published_vectors(impl, data, expected):
    assert crc32c(data) == expected
    assert crc32c_many([data]).tolist() == [expected]


def test_crc32c_equals_the_bitwise_definition_and_continues(impl):
    rng = np.random.default_rng(3)
    for length in [1, 7, 100, NUMPY_MIN - 1, NUMPY_MIN, NUMPY_MIN + 33, 5000]:
        data = rng.bytes(length)
        assert crc32c(data) == _bitwise_crc32c(data)
        # Continued over pieces: the value of the bytes before is the start.
        value = 0
        for start in range(0, length, 1000):
            value = crc32c(data[start : start + 1000], value)
        assert value == crc32c(data)


def test_crc32c_takes_any_bytes_like(impl):
    data = b"123456789"
    for view in (bytearray(data), memoryview(data), np.frombuffer(data, np.uint8), memoryview(b"x" + data)[1:]):
        assert crc32c(view) == 0xE3069283
    assert crc32c_many([bytearray(data), memoryview(data)]).tolist() == [0xE3069283, 0xE3069283]


@pytest.mark.parametrize("length", [NUMPY_MIN + 33, 65536 + 7, 300_001])
def test_numpy_lanes_equal_the_compiled_library_on_long_inputs(length):
    data = os.urandom(length)
    assert crc_module._numpy_crc32c(data) == crc_module._C.value(data)


def test_many_records_together_equal_each_alone(impl):
    rng = np.random.default_rng(1)
    records = [rng.bytes(int(n)) for n in rng.integers(0, 300, 200)]
    records += [rng.bytes(20_000), b"", b"1", b"123456789", bytes(32)]
    got = crc32c_many(records)
    assert got.dtype == np.uint32
    assert got.tolist() == [_bitwise_crc32c(r) for r in records]
    assert got[-2:].tolist() == [0xE3069283, 0x8A9136AA]
    assert masked(got).tolist() == [masked_crc32c(r) for r in records]
    assert crc32c_many([]).tolist() == []


def test_masked_crc_is_tfrecords_rotation_plus_constant(impl):
    # TFRecord's mask: rotate right by 15 bits, add 0xA282EAD8 (mod 2**32).
    assert masked_crc32c(b"") == 0xA282EAD8
    crc = 0xE3069283
    expected = ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
    assert masked_crc32c(b"123456789") == masked(crc) == expected == 0xC78AB0E5
    assert masked(np.array([crc, 0], np.uint32)).tolist() == [expected, 0xA282EAD8]


def test_an_unimportable_library_falls_back_to_numpy(monkeypatch):
    monkeypatch.setitem(sys.modules, "google_crc32c", None)  # import raises ImportError
    assert crc_module._compiled() is None


def test_the_librarys_pure_python_fallback_counts_as_missing(monkeypatch):
    slow = types.ModuleType("google_crc32c")
    slow.implementation = "python"
    monkeypatch.setitem(sys.modules, "google_crc32c", slow)
    assert crc_module._compiled() is None


def test_without_the_library_tfrecord_files_are_read_and_checked_in_numpy(tmp_path):
    # A fresh interpreter in which google_crc32c cannot be imported at all.
    code = f"""
import sys
sys.modules["google_crc32c"] = None
from grainlike.sources.formats import crc32c_checksum as crc32c
from grainlike.dataset.sources.tfrecord import CorruptRecordError, TFRecordIterDataset, write_tfrecords
assert crc32c.IMPLEMENTATION == "numpy", crc32c.IMPLEMENTATION
records = [bytes([i % 251]) * (i * 37 % 3000) for i in range(200)] + [b"y" * 40_000]
path = {str(tmp_path / "f.tfrecord")!r}
write_tfrecords(path, records)
assert list(TFRecordIterDataset(path)) == records
raw = bytearray(open(path, "rb").read())
raw[-100] ^= 1
open(path, "wb").write(raw)
try:
    list(TFRecordIterDataset(path))
except CorruptRecordError as e:
    assert "the checksum of the 40000-byte record does not match" in str(e), e
else:
    raise AssertionError("no error")
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
