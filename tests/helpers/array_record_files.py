"""Writing small ArrayRecord files for tests."""

from __future__ import annotations

import pytest


def write_array_record(path: str, records: list, options: str = "group_size:1") -> str:
    """Writes ``records`` (bytes) to an ArrayRecord file at ``path``; returns ``path``."""
    ar = pytest.importorskip("array_record.python.array_record_module")
    writer = ar.ArrayRecordWriter(str(path), options)
    for record in records:
        writer.write(record)
    writer.close()
    return str(path)
