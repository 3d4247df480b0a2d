"""MaxText-style subclasses of grain's private TFRecord classes work on grainlike.

MaxText reads TFRecords from GCS by subclassing
``grain._src.python.dataset.sources.tfrecord_dataset``'s ``_TFRecordReader``
(its ``__init__`` skips the parent's and sets ``self._reader`` to a binary file
object), ``_TFRecordDatasetIterator`` (its ``__init__`` calls
``DatasetIterator.__init__`` and sets ``self._reader``) and
``TFRecordIterDataset`` (its ``__iter__`` builds that iterator from
``self._path``). The subclasses below are written that way, over an
``io.BytesIO`` standing in for GCS, once per library: records and states must
equal grain's.
"""

from __future__ import annotations

import importlib
import io

import pytest

import grainlike
from grainlike.dataset.sources.tfrecord import CorruptRecordError, write_tfrecords

RECORDS = [b"", b"a", b"hello tfrecord", bytes(range(256)) * 20, b"\x00" * 5000, b"last"]


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "data.tfrecord"
    write_tfrecords(p, RECORDS)
    return str(p)


def _library(name):
    if name == "grain":
        import grain

        return grain, importlib.import_module("grain._src.python.dataset.sources.tfrecord_dataset")
    return grainlike, importlib.import_module("grainlike._src.python.dataset.sources.tfrecord_dataset")


def _in_memory_dataset_class(grain, tfrecord_dataset):
    """The three subclasses, written as MaxText writes its GCS ones."""

    class _BytesTFRecordReader(tfrecord_dataset._TFRecordReader):
        def __init__(self, path):  # pylint: disable=super-init-not-called
            with open(path, "rb") as f:
                self._reader = io.BytesIO(f.read())

    class _BytesTFRecordDatasetIterator(tfrecord_dataset._TFRecordDatasetIterator):
        def __init__(self, path):  # pylint: disable=super-init-not-called
            grain.DatasetIterator.__init__(self)
            self._reader = _BytesTFRecordReader(path)

    class BytesTFRecordIterDataset(tfrecord_dataset.TFRecordIterDataset):
        def __iter__(self):
            return _BytesTFRecordDatasetIterator(self._path)

    return BytesTFRecordIterDataset


def _records_and_states(it):
    out = [(None, it.get_state())]
    for record in it:
        out.append((record, it.get_state()))
    return out


def _run(lib_name, path):
    grain, tfrecord_dataset = _library(lib_name)
    dataset_cls = _in_memory_dataset_class(grain, tfrecord_dataset)
    walk = _records_and_states(iter(dataset_cls(path)))
    # Restore a fresh iterator at the state after the third record.
    it = iter(dataset_cls(path))
    it.set_state(walk[3][1])
    rest = list(it)
    mapped = list(dataset_cls(path).map(len))
    return walk, rest, mapped


@pytest.mark.usefixtures("grain_ref")
def test_maxtext_style_subclasses_give_grains_records_and_states(path):
    walk, rest, mapped = _run("grainlike", path)
    ref_walk, ref_rest, ref_mapped = _run("grain", path)
    assert [r for r, _ in walk[1:]] == RECORDS
    assert walk == ref_walk
    assert rest == ref_rest == RECORDS[3:]
    assert mapped == ref_mapped == [len(r) for r in RECORDS]


@pytest.mark.usefixtures("grain_ref")
def test_private_iterator_built_from_a_path_matches_grains(path):
    got = _records_and_states(_library("grainlike")[1]._TFRecordDatasetIterator(path))
    ref = _records_and_states(_library("grain")[1]._TFRecordDatasetIterator(path))
    assert got == ref


def test_file_object_reader_verifies_the_data_checksum(path):
    raw = bytearray(open(path, "rb").read())
    # The first record (empty) takes 16 bytes; the second's data byte is at 16 + 12.
    raw[28] ^= 0xFF
    _, tfrecord_dataset = _library("grainlike")

    class _BytesReader(tfrecord_dataset._TFRecordReader):
        def __init__(self, data):  # pylint: disable=super-init-not-called
            self._reader = io.BytesIO(data)

    reader = _BytesReader(bytes(raw))
    assert next(reader) == b""
    with pytest.raises(CorruptRecordError, match=r"at byte 16: the checksum of the 1-byte record does not match"):
        next(reader)


def test_file_object_reader_reports_a_truncated_record(path):
    raw = open(path, "rb").read()
    _, tfrecord_dataset = _library("grainlike")

    class _BytesReader(tfrecord_dataset._TFRecordReader):
        def __init__(self, data):  # pylint: disable=super-init-not-called
            self._reader = io.BytesIO(data)

    reader = _BytesReader(raw[:-3])
    for _ in RECORDS[:-1]:
        next(reader)
    with pytest.raises(CorruptRecordError, match=r"the record of 4 bytes is truncated \(5 of 8 bytes left\)"):
        next(reader)
