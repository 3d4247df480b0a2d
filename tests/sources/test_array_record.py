"""ArrayRecordDataSource on real ArrayRecord files."""

import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import pathlib
import pickle
import sys

import pytest

from grainlike.sources import ArrayRecordDataSource, RandomAccessDataSource, SupportsBatchedRead
from grainlike.sources.array_record import RecordKeyOutOfRangeError
from tests.helpers.processes import run_in_session

array_record_module = pytest.importorskip("array_record.python.array_record_module")

TIMEOUT = 60


def record(file_index, i):
    return f"file{file_index}-record{i:04d}-".encode() * 3


def write(path, records, options="group_size:1"):
    writer = array_record_module.ArrayRecordWriter(str(path), options)
    for r in records:
        writer.write(r)
    writer.close()
    return str(path)


@pytest.fixture
def files(tmp_path):
    """Three files of 10, 0 and 25 records."""
    sizes = [10, 0, 25]
    paths = [write(tmp_path / f"data-{f}.array_record", [record(f, i) for i in range(n)]) for f, n in enumerate(sizes)]
    expected = [record(f, i) for f, n in enumerate(sizes) for i in range(n)]
    return paths, expected


@dataclasses.dataclass
class FileInstruction:
    filename: str
    skip: int
    take: int
    examples_in_shard: int = 0


def sha1_of(names):
    h = hashlib.sha1()
    for n in names:
        h.update(n.encode())
    return h.hexdigest()


def test_single_and_multiple_files(files):
    paths, expected = files
    with ArrayRecordDataSource(paths) as source:
        assert len(source) == 35
        assert [source[i] for i in range(35)] == expected
        assert list(source) == expected
        assert source.paths == paths
        assert repr(source) == f"ArrayRecordDataSource(hash_of_paths={sha1_of(paths)})"
    single = ArrayRecordDataSource(paths[2])
    assert len(single) == 25 and single[24] == record(2, 24)
    assert repr(single) == f"ArrayRecordDataSource(hash_of_paths={sha1_of([paths[2]])})"


def test_pathlike_paths(files):
    paths, expected = files
    source = ArrayRecordDataSource([pathlib.Path(p) for p in paths])
    assert [source[i] for i in range(len(source))] == expected
    assert repr(source) == repr(ArrayRecordDataSource(paths))


def test_file_instructions_and_slice_syntax(files):
    paths, _ = files
    source = ArrayRecordDataSource([FileInstruction(paths[0], 2, 3), f"{paths[2]}[20:25]", paths[0]])
    want = [record(0, i) for i in (2, 3, 4)] + [record(2, i) for i in range(20, 25)] + [record(0, i) for i in range(10)]
    assert len(source) == len(want)
    assert [source[i] for i in range(len(source))] == want
    # Only file names enter the hash (Grain's rule), not skip/take.
    assert repr(source) == f"ArrayRecordDataSource(hash_of_paths={sha1_of([paths[0], paths[2], paths[0]])})"
    assert repr(ArrayRecordDataSource(FileInstruction(paths[0], 0, 1))) == repr(ArrayRecordDataSource(paths[0]))


def test_getitems_batched_reads_across_files(files):
    paths, expected = files
    source = ArrayRecordDataSource(paths)
    keys = [34, 0, 9, 10, 3, 3, 20, 0]
    assert source.__getitems__(keys) == [expected[k] for k in keys]
    assert source.__getitems__([]) == []
    import numpy as np

    assert source.__getitems__(np.array([5, 30])) == [expected[5], expected[30]]
    assert source[np.int64(11)] == expected[11]
    assert isinstance(source, RandomAccessDataSource) and isinstance(source, SupportsBatchedRead)


def test_getitems_uses_one_read_per_file(files, monkeypatch):
    paths, expected = files
    source = ArrayRecordDataSource(paths)
    calls = []
    real_reader = source._reader

    class Spy:
        def __init__(self, reader, index):
            self.reader, self.index = reader, index

        def read(self, positions):
            calls.append((self.index, list(positions)))
            return self.reader.read(positions)

    monkeypatch.setattr(source, "_reader", lambda i: Spy(real_reader(i), i))
    assert source.__getitems__([12, 1, 30, 2]) == [expected[k] for k in (12, 1, 30, 2)]
    assert sorted(calls) == [(0, [1, 2]), (2, [2, 20])]


def test_readers_open_lazily_and_are_dropped_on_pickle(files):
    paths, expected = files
    source = ArrayRecordDataSource(paths)
    assert source._readers == [None, None, None]
    assert source[12] == expected[12]
    assert source._readers[2] is not None and source._readers[0] is None
    copy = pickle.loads(pickle.dumps(source))
    assert copy._readers == [None, None, None]
    assert copy[0] == expected[0] and repr(copy) == repr(source)
    source.close()
    assert source._readers == [None, None, None]
    assert source[1] == expected[1]  # reopens after close(), like Grain
    source.close()
    source.close()


def test_out_of_range_keys(files):
    paths, _ = files
    source = ArrayRecordDataSource(paths)
    for key in (35, -1, 10**9):
        with pytest.raises(IndexError, match=f"record_key {key} is out of range .* length 35"):
            source[key]
        with pytest.raises(ValueError):  # what Grain raises
            source[key]
    with pytest.raises(RecordKeyOutOfRangeError, match="record_key 35"):
        source.__getitems__([1, 35, 2])


def test_invalid_paths(tmp_path, files):
    paths, _ = files
    missing = str(tmp_path / "missing.array_record")
    with pytest.raises(FileNotFoundError, match="missing.array_record"):
        ArrayRecordDataSource(missing)
    with pytest.raises(FileNotFoundError, match="missing.array_record"):
        ArrayRecordDataSource([paths[0], missing])
    with pytest.raises(FileNotFoundError, match="missing.array_record"):
        ArrayRecordDataSource(FileInstruction(missing, 0, 3))
    with pytest.raises(FileNotFoundError, match="missing.array_record"):
        ArrayRecordDataSource(f"{missing}[0:3]")
    with pytest.raises(ValueError, match="empty"):
        ArrayRecordDataSource([])
    with pytest.raises(ValueError, match=r"paths\[1\] is 3 of type int"):
        ArrayRecordDataSource([paths[0], 3])
    with pytest.raises(ValueError, match="unsupported paths"):
        ArrayRecordDataSource(42)
    with pytest.raises(ValueError, match="skip=-1"):
        ArrayRecordDataSource(FileInstruction(paths[0], -1, 3))
    garbage = tmp_path / "garbage.array_record"
    garbage.write_bytes(b"not an array record file" * 100)
    with pytest.raises(ValueError, match="garbage.array_record.* not a readable ArrayRecord"):
        ArrayRecordDataSource(str(garbage))


def test_file_removed_after_construction(tmp_path):
    path = write(tmp_path / "gone.array_record", [b"a", b"b"])
    source = ArrayRecordDataSource(path)
    os.remove(path)
    with pytest.raises(FileNotFoundError, match="gone.array_record"):
        source[0]


def test_corrupt_file_error_names_file_and_key(tmp_path):
    path = tmp_path / "corrupt.array_record"
    write(path, [bytes([i]) * 300 for i in range(50)])
    data = bytearray(path.read_bytes())
    data[64:1200] = os.urandom(1200 - 64)  # chunk headers and data, not the footer/index
    path.write_bytes(bytes(data))
    source = ArrayRecordDataSource(str(path))
    assert len(source) == 50
    with pytest.raises(RuntimeError, match=r"failed to read record_key 0 \(position 0 in file '.*corrupt.array_record'\)"):
        source[0]
    with pytest.raises(RuntimeError, match=r"record_key \d+ .*corrupt.array_record.*Corrupted"):
        source.__getitems__([0, 1, 2])


def test_group_size_warning(tmp_path, caplog):
    path = write(tmp_path / "grouped.array_record", [b"x"] * 10, options="group_size:4")
    source = ArrayRecordDataSource(path)
    with caplog.at_level(logging.WARNING, logger="grainlike.sources.array_record"):
        assert source[5] == b"x"
    assert "group_size:4" in caplog.text


def test_reader_options_are_passed(files):
    paths, expected = files
    options = {"index_storage_option": "offloaded", "footer_prefetch_bytes": "0"}
    source = ArrayRecordDataSource(paths, reader_options=options)
    assert source._reader_options == "readahead_buffer_size:0,index_storage_option:offloaded,footer_prefetch_bytes:0"
    assert source[30] == expected[30]
    bad = ArrayRecordDataSource(paths, reader_options={"no_such_option": "1"})
    with pytest.raises(Exception, match="no_such_option"):
        bad[0]


def _read_keys(source, keys):
    return source.__getitems__(keys) + [source[k] for k in keys]


_FORKED_CHILDREN_READ = r"""
import json, multiprocessing, sys
from grainlike.sources import ArrayRecordDataSource

paths, expected = json.loads(sys.argv[1])
expected = [e.encode() for e in expected]
source = ArrayRecordDataSource(paths)


def read_keys(keys):
    return source.__getitems__(keys) + [source[k] for k in keys]


if __name__ == "__main__":
    # Open readers in the parent first: a forked child must open its own.
    assert source.__getitems__([0, 20]) == [expected[0], expected[20]]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        got = pool.map_async(read_keys, [[1, 34], [9, 10]]).get(60)
    assert got == [[expected[k] for k in [1, 34, 1, 34]], [expected[k] for k in [9, 10, 9, 10]]]
    assert source[33] == expected[33]
    source.close()
    print("ok")
"""


def _run_script(tmp_path, text, arg):
    script = tmp_path / "script.py"
    script.write_text(text)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc, out, err = run_in_session([sys.executable, str(script), json.dumps(arg)], timeout=TIMEOUT + 30, env=env)
    assert proc.returncode == 0 and out.strip() == "ok", err
    return err


def test_forked_children_read(tmp_path):
    # In a script of its own, as a user's program forks: forking the test process,
    # with every thread earlier tests left running (JAX's among them), may deadlock
    # the child on a lock one of those threads held, whatever the source does.
    # Uncompressed files: decompressing starts riegeli's background thread, and a
    # fork can copy its lock held (see the next test).
    sizes = [10, 0, 25]
    paths = [
        write(tmp_path / f"data-{f}.array_record", [record(f, i) for i in range(n)], "group_size:1,uncompressed")
        for f, n in enumerate(sizes)
    ]
    expected = [record(f, i).decode() for f, n in enumerate(sizes) for i in range(n)]
    _run_script(tmp_path, _FORKED_CHILDREN_READ, [paths, expected])


_FORK_WARNING = r"""
import json, multiprocessing, sys
from grainlike.sources import ArrayRecordDataSource

paths, expected = json.loads(sys.argv[1])


def read(key):
    return ArrayRecordDataSource(paths)[key].decode()


if __name__ == "__main__":
    fork = multiprocessing.get_context("fork")
    # Forked before any reader was opened: nothing to warn of.
    with fork.Pool(1) as pool:
        assert pool.apply_async(read, (1,)).get(60) == expected[1]
    print("--- opened in the parent", file=sys.stderr, flush=True)
    assert read(0) == expected[0]
    with fork.Pool(1) as pool:
        assert pool.map_async(read, [9, 20]).get(60) == [expected[9], expected[20]]
    print("ok")
"""


def test_forked_child_warns_that_array_record_is_not_fork_safe(tmp_path):
    # Uncompressed files: the child's reads succeed (decompressing could meet
    # riegeli's inherited lock, which the warning is about).
    paths = [
        write(tmp_path / f"data-{f}.array_record", [record(f, i) for i in range(n)], "group_size:1,uncompressed")
        for f, n in enumerate([10, 25])
    ]
    expected = [record(f, i).decode() for f, n in enumerate([10, 25]) for i in range(n)]
    err = _run_script(tmp_path, _FORK_WARNING, [paths, expected])
    before, after = err.split("--- opened in the parent")
    assert "not fork-safe" not in before, err
    # Once per process, naming the process and the file, and what to do instead.
    assert after.count("not fork-safe") == 1, err
    assert any(repr(p) in after for p in paths) and "'spawn' or 'forkserver'" in after, err


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_children_read(files, method):
    paths, expected = files
    source = ArrayRecordDataSource(paths)
    # Open readers in the parent first: a forked child must open its own.
    assert source.__getitems__([0, 20]) == [expected[0], expected[20]]
    ctx = multiprocessing.get_context(method)
    with ctx.Pool(2) as pool:
        got = pool.starmap_async(_read_keys, [(source, [1, 34]), (source, [9, 10])]).get(TIMEOUT)
    assert got == [[expected[k] for k in [1, 34, 1, 34]], [expected[k] for k in [9, 10, 9, 10]]]
    assert source[33] == expected[33]
    source.close()
