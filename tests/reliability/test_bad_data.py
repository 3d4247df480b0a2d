"""Bad input: broken files, vanished paths, unparsable records, unstackable elements.

Each case must end in an error that names the file / record key / transform and
what was expected, never a hang, with and without worker processes.
"""

import json
import os
import shutil
import traceback

import numpy as np
import pytest

import grainlike as grain
from tests.reliability import transforms
from tests.reliability.transforms import (
    BigOddShapeAt,
    Decode,
    KeepAll,
    MixedDtypeAt,
    OddShapeAt,
    OddStructureAt,
)

pytest.importorskip("array_record")
from array_record.python.array_record_module import ArrayRecordWriter  # noqa: E402

N = 24
BAD_KEY = 7
WORKERS = [0, 2]


def _write(path, records):
    writer = ArrayRecordWriter(str(path), "group_size:1,uncompressed")
    for r in records:
        writer.write(r)
    writer.close()
    return str(path)


def _record(i):
    return json.dumps({"id": i, "pad": "x" * 200}).encode()


@pytest.fixture(scope="module")
def good_file(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("ar") / "good.array_record", [_record(i) for i in range(N)])


@pytest.fixture
def copy_of(good_file, tmp_path):
    def make(name="data.array_record"):
        path = str(tmp_path / name)
        shutil.copy(good_file, path)
        return path

    return make



def _loader(source, ops=(), workers=0):
    n = len(source)
    return grain.DataLoader(
        data_source=source,
        sampler=grain.IndexSampler(n, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
        operations=list(ops),
        worker_count=workers,
        # With workers, every record goes through them (warm start would compute
        # these small pipelines in process, which the workers=0 cases cover).
        warm_start=False,
    )


def _drain(it):
    got = []
    while True:
        try:
            got.append(next(it))
        except StopIteration:
            return got


def _notes(e):
    return "\n".join(getattr(e, "__notes__", []))


# -- files ---------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_truncated_file_is_refused_when_the_source_is_built(no_leaks, copy_of):
    path = copy_of()
    data = open(path, "rb").read()
    for cut in (len(data) // 2, len(data) - 100, 10):
        with open(path, "wb") as f:
            f.write(data[:cut])
        with pytest.raises(ValueError, match="is not a readable ArrayRecord file") as info:
            grain.ArrayRecordDataSource(path)
        msg = str(info.value)
        assert repr(path) in msg
        assert "()" not in msg  # always a reason, even when the reader gives none


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers", WORKERS)
def test_file_truncated_after_the_loader_was_built_names_the_file(no_leaks, copy_of, workers):
    path = copy_of()
    loader = _loader(grain.ArrayRecordDataSource(path), [Decode()], workers)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with iter(loader) as it:
        with pytest.raises(ValueError, match="is not a readable ArrayRecord file") as info:
            _drain(it)
    assert repr(path) in str(info.value)
    assert "record_key 0" in _notes(info.value)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers", WORKERS)
def test_flipped_bytes_in_a_record_name_its_key_and_file(no_leaks, copy_of, workers):
    path = copy_of()
    data = bytearray(open(path, "rb").read())
    at = data.index(_record(BAD_KEY))
    for off in range(at + 20, at + 30):
        data[off] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(data))
    loader = _loader(grain.ArrayRecordDataSource(path), [Decode()], workers)
    with iter(loader) as it:
        with pytest.raises(RuntimeError) as info:
            got = []
            while True:
                got.append(int(next(it)["id"]))
    msg = str(info.value)
    assert f"record_key {BAD_KEY} " in msg and repr(path) in msg
    assert "hash mismatch" in msg  # what the reader expected and did not find
    assert got == list(range(BAD_KEY))  # everything before it, in order


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers", WORKERS)
def test_path_that_vanishes_after_the_loader_was_built(no_leaks, copy_of, workers):
    path = copy_of()
    loader = _loader(grain.ArrayRecordDataSource(path), [Decode()], workers)
    os.remove(path)
    with iter(loader) as it:
        with pytest.raises(FileNotFoundError, match="file not found") as info:
            next(it)
    assert repr(path) in str(info.value)
    assert "record_key 0" in _notes(info.value)


@pytest.mark.timeout(30)
def test_empty_file_list_and_empty_file_are_refused(no_leaks, tmp_path):
    with pytest.raises(ValueError, match="list of paths is empty"):
        grain.ArrayRecordDataSource([])
    empty = tmp_path / "empty.array_record"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="not a readable ArrayRecord file") as info:
        grain.ArrayRecordDataSource(str(empty))
    assert str(empty) in str(info.value)
    no_records = grain.ArrayRecordDataSource(_write(tmp_path / "none.array_record", []))
    assert len(no_records) == 0
    with pytest.raises(ValueError, match="Got 0 records"):
        grain.IndexSampler(len(no_records), grain.NoSharding(), shuffle=False, num_epochs=1, seed=0)


# -- records ---------------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers", WORKERS)
def test_record_a_decode_transform_cannot_parse(no_leaks, tmp_path, workers):
    records = [_record(i) for i in range(N)]
    records[BAD_KEY] = b"\xff\xfe not json"
    source = grain.ArrayRecordDataSource(_write(tmp_path / "bad.array_record", records))
    with iter(_loader(source, [Decode(), grain.Batch(2)], workers)) as it:
        with pytest.raises(ValueError) as info:  # json's own error, passed on unchanged
            _drain(it)
    notes = _notes(info.value)
    assert "Decode" in notes and f"record_key {BAD_KEY}" in notes
    if workers:
        assert "worker 1" in notes
        # The worker's frames are in the traceback: the transform's, then json's.
        frames = [(f.filename, f.name) for f in traceback.extract_tb(info.value.__traceback__)]
        assert (transforms.__file__, "map") in frames, frames






@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("transform", [OddShapeAt, OddStructureAt, BigOddShapeAt])
def test_unstackable_element_names_record_key_and_transform(no_leaks, workers, transform):
    loader = _loader(list(range(16)), [transform(13), KeepAll(), grain.Batch(4)], workers)
    with iter(loader) as it:
        with pytest.raises(ValueError, match="Batch: cannot stack the elements") as info:
            _drain(it)
    notes = _notes(info.value)
    assert "record_key 13 (global index 13)" in notes
    # The filter passes elements through: the maker is the map before it.
    assert f"produced by transform {transform.__name__}" in notes
    assert "1 of the 4 elements differ" in notes


@pytest.mark.timeout(30)
def test_unstackable_elements_straight_from_the_source_name_the_source(no_leaks):
    source = [np.zeros(2), np.zeros(2), np.zeros(5), np.zeros(2)]
    with pytest.raises(ValueError, match="cannot stack") as info:
        list(_loader(source, [grain.Batch(4)]))
    assert "record_key 2 (global index 2): ((5,),)" in _notes(info.value) or (
        "record_key 2 (global index 2): (5,)" in _notes(info.value)
    )
    assert "produced by data source" in _notes(info.value)



@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers", WORKERS)
def test_mixed_dtypes_are_promoted_as_grain_does(no_leaks, workers):
    # grain stacks with np.stack, which promotes; only that batch changes dtype.
    with iter(_loader(list(range(8)), [MixedDtypeAt(5), grain.Batch(4)], workers)) as it:
        batches = [b["x"] for b in it]
    assert [b.dtype for b in batches] == [np.int32, np.float64]
    assert sorted(int(b[i, 0, 0]) for b in batches for i in range(4)) == list(range(8))
