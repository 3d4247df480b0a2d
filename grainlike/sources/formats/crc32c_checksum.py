"""CRC-32C (Castagnoli), the checksum of TFRecord files.

The checksums come from ``google-crc32c`` (Google's C library, with the CPU's CRC32
instruction; ~5-11 GB/s on this project's 2-core machine). Where its compiled
extension cannot be imported, the same values are computed in numpy (~135 MB/s on
64 MiB). ``IMPLEMENTATION`` says which is in use.

The numpy fallback relies on the register update being linear over GF(2): the
register after some bytes is the register those bytes give from zero, xor the
starting register advanced over as many zero bytes (operators built for each power
of two by squaring). Short inputs go through a byte table in Python; a long input is
cut into lanes of ``_LANE`` bytes advanced together, two bytes per numpy step, and
folded pairwise; many short records advance together, right-aligned behind zeros.
"""

from __future__ import annotations

import functools
import warnings
from types import ModuleType
from typing import Any, Optional, Sequence

import numpy as np

_POLY = 0x82F63B78  # Reflected Castagnoli polynomial.
_MASK_DELTA = 0xA282EAD8
_INIT = 0xFFFFFFFF
# Below this many bytes the Python loop is faster than the numpy lanes
# (measured on 2 cores).
NUMPY_MIN = 1536
# Bytes per lane of one long input: each numpy step advances every lane by two
# bytes, so shorter lanes mean fewer (longer) steps.
_LANE = 32
# numpy fallback of crc32c_many: records at least this long get their checksum
# alone (in numpy lanes); shorter ones of similar lengths together, when at
# least _MIN_GROUP of them are (a step over many records costs about as much
# as 25 bytes of the byte loop).
_ALONE_BYTES = 16384
_MIN_GROUP = 16


def _compiled() -> Optional[ModuleType]:
    """``google_crc32c`` if its C extension imports; None if only its pure-Python one does, or nothing."""
    try:
        with warnings.catch_warnings():
            # It warns when it falls back to pure Python; the numpy code below
            # then takes over, so the warning would be about code never used.
            warnings.simplefilter("ignore", RuntimeWarning)
            import google_crc32c
    except ImportError:
        return None
    return google_crc32c if getattr(google_crc32c, "implementation", None) == "c" else None


_C = _compiled()
IMPLEMENTATION = "google-crc32c" if _C is not None else "numpy"


def crc32c(data: Any, value: int = 0) -> int:
    """The CRC-32C of ``data`` (bytes-like); ``value`` is the CRC of bytes before it, to continue.

    Example:
      >>> hex(crc32c(b"123456789"))
      '0xe3069283'
    """
    if _C is None:
        return _numpy_crc32c(data, value)
    if type(data) is not bytes:
        data = bytes(memoryview(data).cast("B"))  # The C functions take bytes only.
    return _C.extend(value, data) if value else _C.value(data)


def crc32c_many(records: Sequence[Any]) -> np.ndarray:
    """The CRC-32C of each of ``records`` (bytes-like), as uint32.

    Example:
      >>> [hex(c) for c in crc32c_many([b"123456789", b""])]
      ['0xe3069283', '0x0']
    """
    if _C is None:
        return _numpy_crc32c_many(records)
    try:
        return np.fromiter(map(_C.value, records), dtype=np.uint32, count=len(records))
    except TypeError:  # Not all bytes: the C function takes bytes only.
        return np.fromiter((crc32c(r) for r in records), dtype=np.uint32, count=len(records))


def masked(crc: Any) -> Any:
    """TFRecord's mask of a CRC (an int or a uint32 array): rotated right 15 bits, plus a constant."""
    if isinstance(crc, np.ndarray):
        crc = crc.astype(np.uint64)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def masked_crc32c(data: Any) -> int:
    """TFRecord's masked CRC of ``data``.

    Example:
      >>> hex(masked_crc32c(b""))
      '0xa282ead8'
    """
    # The C function called here directly: this runs once or twice per TFRecord record.
    crc = _C.value(data) if _C is not None and type(data) is bytes else crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


# -- the numpy fallback ---------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_POLY), table >> 1).astype(np.uint32)
    return table


@functools.lru_cache(maxsize=None)
def _table_list() -> list:
    return _table().tolist()


@functools.lru_cache(maxsize=None)
def _table16() -> np.ndarray:
    # Two byte steps from register x (its low 16 bits xor the two bytes).
    table = _table()
    x = np.arange(1 << 16, dtype=np.uint32)
    y = table[x & 0xFF] ^ (x >> 8)
    return table[y & 0xFF] ^ (y >> 8)


def _advance_py(register: int, data: Any) -> int:
    table = _table_list()
    for b in data:
        register = table[(register ^ b) & 0xFF] ^ (register >> 8)
    return register


def _apply(tables: np.ndarray, regs: np.ndarray) -> np.ndarray:
    """A linear map of registers, given as four 256-entry tables (one per byte)."""
    low = tables[0][regs & 0xFF] ^ tables[1][(regs >> 8) & 0xFF]
    return low ^ tables[2][(regs >> 16) & 0xFF] ^ tables[3][regs >> 24]


def _tables_of(images: np.ndarray) -> np.ndarray:
    """The byte tables of the linear map sending bit ``i`` to ``images[i]``."""
    values = np.arange(256, dtype=np.uint32)
    tables = np.zeros((4, 256), dtype=np.uint32)
    for byte in range(4):
        for bit in range(8):
            tables[byte] ^= np.where((values >> bit) & 1, images[byte * 8 + bit], np.uint32(0)).astype(np.uint32)
    return tables


_BASIS = (np.uint32(1) << np.arange(32, dtype=np.uint32)).astype(np.uint32)


@functools.lru_cache(maxsize=64)
def _zeros_tables(power: int) -> np.ndarray:
    """Byte tables of the register's advance over ``2**power`` zero bytes."""
    if power == 0:
        return _tables_of(_table()[_BASIS & 0xFF] ^ (_BASIS >> 8))
    half = _zeros_tables(power - 1)
    return _tables_of(_apply(half, _apply(half, _BASIS)))


def _over_zeros(regs: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Each register advanced over its own number of zero bytes."""
    regs = regs.copy()
    lengths = np.asarray(lengths, dtype=np.int64)
    top = int(lengths.max()).bit_length() if len(lengths) else 0
    for power in range(top):
        chosen = np.flatnonzero((lengths >> power) & 1)
        if len(chosen):
            regs[chosen] = _apply(_zeros_tables(power), regs[chosen])
    return regs


def _from_zero(columns: np.ndarray) -> np.ndarray:
    """Registers advanced from zero over ``columns`` (steps x lanes, two bytes each)."""
    lanes = columns.shape[1]
    regs = np.zeros(lanes, dtype=np.uint32)
    index = np.empty(lanes, dtype=np.uint32)
    looked_up = np.empty(lanes, dtype=np.uint32)
    table = _table16()
    for column in columns:
        np.bitwise_xor(regs, column, out=index)
        np.bitwise_and(index, 0xFFFF, out=index)
        np.take(table, index, out=looked_up)
        np.right_shift(regs, 16, out=regs)
        np.bitwise_xor(regs, looked_up, out=regs)
    return regs


def _advance_np(register: int, data: memoryview) -> int:
    k = len(data) // _LANE
    lanes = np.frombuffer(data, dtype="<u2", count=k * _LANE // 2).reshape(k, _LANE // 2)
    regs = _from_zero(np.ascontiguousarray(lanes.T))
    # Fold neighbouring lanes pairwise: (a, b) -> advance(a over b's length) ^ b.
    # A zero lane in front changes nothing (a zero register stays zero over zeros).
    power = (_LANE - 1).bit_length()
    while len(regs) > 1:
        if len(regs) % 2:
            regs = np.concatenate([np.zeros(1, np.uint32), regs])
        regs = _apply(_zeros_tables(power), regs[0::2]) ^ regs[1::2]
        power += 1
    start = _over_zeros(np.array([register], np.uint32), np.array([k * _LANE]))
    return _advance_py(int(regs[0] ^ start[0]), data[k * _LANE :])


def _numpy_crc32c(data: Any, value: int = 0) -> int:
    """``crc32c`` in numpy and Python."""
    register = value ^ _INIT
    data = memoryview(data).cast("B")  # Its items are Python ints, whatever held the bytes.
    if len(data) < NUMPY_MIN:
        register = _advance_py(register, data)
    else:
        register = _advance_np(register, data)
    return register ^ _INIT


def _numpy_crc32c_together(records: Sequence[Any]) -> np.ndarray:
    """The CRC-32C of each of ``records`` (of similar lengths: the longest sets the cost), side by side."""
    count = len(records)
    lengths = np.fromiter((len(r) for r in records), dtype=np.int64, count=count)
    width = int(lengths.max()) if count else 0
    width += width % 2
    matrix = np.zeros((count, width), dtype=np.uint8)  # Right-aligned, zeros in front.
    for i, r in enumerate(records):
        if len(r):
            matrix[i, width - len(r) :] = np.frombuffer(r, dtype=np.uint8)
    columns = np.ascontiguousarray(matrix.view("<u2").T)
    regs = _from_zero(columns) ^ _over_zeros(np.full(count, _INIT, np.uint32), lengths)
    return regs ^ np.uint32(_INIT)


def _numpy_crc32c_many(records: Sequence[Any]) -> np.ndarray:
    """``crc32c_many`` in numpy: short records of similar lengths together, long ones alone."""
    out = np.zeros(len(records), dtype=np.uint32)
    groups: dict = {}
    for i, r in enumerate(records):
        if len(r) >= _ALONE_BYTES:
            out[i] = _numpy_crc32c(r)
        else:
            groups.setdefault(len(r).bit_length(), []).append(i)
    for members in groups.values():
        if len(members) < _MIN_GROUP:
            for i in members:
                out[i] = _numpy_crc32c(records[i])
        else:
            out[members] = _numpy_crc32c_together([records[i] for i in members])
    return out
