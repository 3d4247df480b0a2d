"""Differential tests: grainlike's sources against grain 0.2.18's for the same inputs."""

import dataclasses
import os
import pathlib
import secrets

import numpy as np
import pytest

import grainlike.sources as gl

array_record_module = pytest.importorskip("array_record.python.array_record_module")


@dataclasses.dataclass
class FileInstruction:
    filename: str
    skip: int
    take: int
    examples_in_shard: int = 0


def write(path, records):
    writer = array_record_module.ArrayRecordWriter(str(path), "group_size:1")
    for r in records:
        writer.write(r)
    writer.close()
    return str(path)


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    sizes = [7, 0, 30, 12]
    return [
        write(tmp_path / f"shard-{f:05d}-of-00004", [rng.bytes(int(rng.integers(0, 200))) for _ in range(n)])
        for f, n in enumerate(sizes)
    ]


def assert_same(ours, theirs):
    assert repr(ours) == repr(theirs)
    assert len(ours) == len(theirs)
    n = len(theirs)
    assert [ours[i] for i in range(n)] == [theirs[i] for i in range(n)]
    keys = list(np.random.default_rng(1).integers(0, n, 3 * n)) if n else []
    keys = [int(k) for k in keys]
    if hasattr(theirs, "__getitems__"):
        assert ours.__getitems__(keys) == theirs.__getitems__(keys)
    else:
        assert ours.__getitems__(keys) == [theirs[k] for k in keys]


def test_exports(grain_ref):
    import grain.sources as grain_sources

    assert gl.InMemoryDataSource is gl.SharedMemoryDataSource
    for name in ("ArrayRecordDataSource", "InMemoryDataSource", "RangeDataSource", "RandomAccessDataSource"):
        assert hasattr(grain_ref, name) and hasattr(gl, name)
    for name in ("ArrayRecordDataSource", "SharedMemoryDataSource", "RangeDataSource", "RandomAccessDataSource"):
        assert hasattr(grain_sources, name) and hasattr(gl, name)


@pytest.mark.parametrize("args", [(0, 10, 2), (10, 0, -2), (0, 0, 1), (3, 4, 5), (-7, 8, 3), (0, 1000, 7)])
def test_range(grain_ref, args):
    assert_same(gl.RangeDataSource(*args), grain_ref.RangeDataSource(*args))


@pytest.mark.parametrize("args", [(0, 10, 0), (10, 0, 1)])
def test_range_errors(grain_ref, args):
    with pytest.raises(AssertionError) as theirs:
        grain_ref.RangeDataSource(*args)
    with pytest.raises(AssertionError) as ours:
        gl.RangeDataSource(*args)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("key", [-1, 5])
def test_range_index_errors(grain_ref, key):
    with pytest.raises(IndexError) as theirs:
        grain_ref.RangeDataSource(0, 5, 1)[key]
    with pytest.raises(IndexError) as ours:
        gl.RangeDataSource(0, 5, 1)[key]
    assert str(ours.value) == str(theirs.value)


def test_range_protocol(grain_ref):
    assert isinstance(gl.RangeDataSource(0, 3, 1), grain_ref.RandomAccessDataSource)
    assert isinstance(grain_ref.RangeDataSource(0, 3, 1), gl.RandomAccessDataSource)


IN_MEMORY_CASES = [
    list(range(12)),
    [1, -5, 2.5, "abc", "ü", b"\x01\x02", None, True, False, 2**63 - 1],
    [],
    ["x" * 1000, b"y" * 500],
]


@pytest.mark.parametrize("elements", IN_MEMORY_CASES)
def test_in_memory_named(grain_ref, elements):
    tag = secrets.token_hex(4)
    theirs = grain_ref.InMemoryDataSource(elements, name=f"gltest_{tag}_grain")
    try:
        name = f"gltest_{tag}_ours"
        with gl.InMemoryDataSource(elements, name=name) as ours:
            assert len(ours) == len(theirs)
            got = [ours[i] for i in range(len(ours))]
            want = [theirs[i] for i in range(len(theirs))]
            assert got == want and [type(x) for x in got] == [type(x) for x in want]
            # Same repr, modulo the (different) segment names.
            assert repr(ours) == repr(theirs).replace(f"gltest_{tag}_grain", name)
            assert str(ours) == str(theirs).replace(f"gltest_{tag}_grain", name)
        same_name = gl.InMemoryDataSource(elements, name=f"gltest_{tag}_x")
        theirs_repr_with = repr(theirs).replace(f"gltest_{tag}_grain", f"gltest_{tag}_x")
        assert repr(same_name) == theirs_repr_with
        same_name.close()
    finally:
        theirs.close()
        theirs.unlink()


def test_in_memory_unnamed_repr_is_deterministic_unlike_grains(grain_ref):
    # Grain embeds a random segment name ("psm_..."), so its repr differs for equal
    # data; ours is a content hash.
    a, b = grain_ref.InMemoryDataSource([1, 2, 3]), grain_ref.InMemoryDataSource([1, 2, 3])
    try:
        assert repr(a) != repr(b) and "name='psm_" in repr(a)
    finally:
        for s in (a, b):
            s.close()
            s.unlink()
    with gl.InMemoryDataSource([1, 2, 3]) as c, gl.InMemoryDataSource([1, 2, 3]) as d:
        assert repr(c) == repr(d)


def test_in_memory_negative_keys_like_grain(grain_ref):
    theirs = grain_ref.InMemoryDataSource([1, 2, 3])
    try:
        with gl.InMemoryDataSource([1, 2, 3]) as ours:
            assert ours[-1] == theirs[-1] and ours[-3] == theirs[-3]
            with pytest.raises(IndexError):
                theirs[3]
            with pytest.raises(IndexError):
                ours[3]
    finally:
        theirs.close()
        theirs.unlink()


def test_in_memory_array_matches_plain_ndarray_source():
    # A plain ndarray is itself a Grain source; ours returns the same records.
    data = np.arange(60, dtype=np.float32).reshape(10, 2, 3)
    with gl.InMemoryDataSource(data) as ours:
        for i in range(10):
            np.testing.assert_array_equal(ours[i], data[i])


def test_array_record_paths(grain_ref, files):
    cases = [
        files,
        files[2],
        pathlib.Path(files[3]),
        [pathlib.Path(p) for p in files],
        [files[2], files[0], files[2]],
        [FileInstruction(files[2], 5, 10), FileInstruction(files[0], 0, 7)],
        FileInstruction(files[3], 1, 3),
        [f"{files[2]}[3:9]", files[3]],
    ]
    for paths in cases:
        assert_same(gl.ArrayRecordDataSource(paths), grain_ref.ArrayRecordDataSource(paths))
        assert gl.ArrayRecordDataSource(paths).paths == grain_ref.ArrayRecordDataSource(paths).paths


def test_array_record_relative_paths_hash_as_given(grain_ref, files, monkeypatch):
    monkeypatch.chdir(os.path.dirname(files[0]))
    rel = [os.path.basename(p) for p in files]
    ours, theirs = gl.ArrayRecordDataSource(rel), grain_ref.ArrayRecordDataSource(rel)
    assert repr(ours) == repr(theirs) != repr(gl.ArrayRecordDataSource(files))


def test_array_record_reader_options(grain_ref, files):
    options = {"index_storage_option": "offloaded", "footer_prefetch_bytes": "0"}
    assert_same(
        gl.ArrayRecordDataSource(files, reader_options=options),
        grain_ref.ArrayRecordDataSource(files, reader_options=options),
    )


def test_array_record_errors_compatible(grain_ref, files):
    ours, theirs = gl.ArrayRecordDataSource(files), grain_ref.ArrayRecordDataSource(files)
    for key in (-1, len(theirs)):
        with pytest.raises(ValueError):
            theirs[key]
        with pytest.raises(ValueError):
            ours[key]
    with pytest.raises(ValueError):
        grain_ref.ArrayRecordDataSource([])
    with pytest.raises(ValueError):
        gl.ArrayRecordDataSource([])


def test_array_record_protocol(grain_ref, files):
    assert isinstance(gl.ArrayRecordDataSource(files), grain_ref.RandomAccessDataSource)


@pytest.mark.parametrize("elements", IN_MEMORY_CASES)
def test_in_memory_count_and_index_like_grain(grain_ref, elements):
    # grain's source is a ShareableList, whose count() and index() it inherits.
    theirs = grain_ref.InMemoryDataSource(elements)
    probes = [*elements, 7, "absent", b"", 0.0]
    try:
        with gl.InMemoryDataSource(elements) as ours:
            for value in probes:
                assert ours.count(value) == theirs.count(value), value
                try:
                    expected = theirs.index(value)
                except ValueError as e:
                    with pytest.raises(ValueError) as got:
                        ours.index(value)
                    assert str(got.value) == str(e)
                else:
                    assert ours.index(value) == expected, value
    finally:
        theirs.close()
        theirs.unlink()
