"""The record format written by ``grainlike-convert``: defined in ``grainlike.sources.formats.record_codec``."""

from grainlike.sources.formats.record_codec import (
    MAGIC,
    DecodeRecord,
    RecordFormatError,
    decode_record,
    describe_record,
    encode_record,
    list_shards,
)

__all__ = [
    "MAGIC",
    "DecodeRecord",
    "RecordFormatError",
    "decode_record",
    "describe_record",
    "encode_record",
    "list_shards",
]
