"""CRC-32C: defined in ``grainlike.sources.formats.crc32c_checksum``."""

from grainlike.sources.formats.crc32c_checksum import IMPLEMENTATION, NUMPY_MIN, crc32c, crc32c_many, masked, masked_crc32c

__all__ = ["IMPLEMENTATION", "NUMPY_MIN", "crc32c", "crc32c_many", "masked", "masked_crc32c"]
