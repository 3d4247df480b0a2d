"""ParquetDataSource and ParquetIterDataset: local files, against grain's ParquetIterDataset."""

from __future__ import annotations

import pickle

import cloudpickle
import numpy as np
import pytest

import grainlike as gl
from grainlike.dataset.conformance import assert_equal_output_after_checkpoint
from grainlike.dataset.sources.parquet_iter_dataset import ParquetIterDataset
from grainlike.sources.parquet import ParquetDataSource
from tests.compat.conftest import grain_ref  # noqa: F401 (the fixture)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

TEXT = [[f"file {f} record {i}" for i in range(5)] for f in range(2)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Two files of 5 rows in row groups of 2: text, an int, a float vector per row."""
    d = tmp_path_factory.mktemp("parquet")
    paths = []
    for f, texts in enumerate(TEXT):
        table = pa.table({
            "text": texts,
            "id": np.arange(5, dtype=np.int64) + 10 * f,
            "vec": [np.full(3, 10 * f + i, np.float32) for i in range(5)],
        })
        path = str(d / f"part-{f}.parquet")
        pq.write_table(table, path, row_group_size=2)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def grain_parquet(grain_ref):
    from grain._src.python.dataset.sources import parquet_dataset

    return parquet_dataset.ParquetIterDataset


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return type(a) is type(b) and a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def _assert_same_elements(xs, ys):
    assert len(xs) == len(ys)
    for i, (x, y) in enumerate(zip(xs, ys)):
        assert _same(x, y), (i, x, y)


# -- ParquetIterDataset against grain's ------------------------------------------------


def test_iter_dataset_one_file_matches_grain_with_states(files, grain_parquet):
    ours, theirs = iter(ParquetIterDataset(files[0])), iter(grain_parquet(files[0]))
    for _ in range(5):
        assert ours.get_state() == theirs.get_state()
        _assert_same_elements([next(ours)], [next(theirs)])
    assert ours.get_state() == theirs.get_state() == {"row_group": 2, "index_within_row_group": 1}
    with pytest.raises(StopIteration):
        next(ours)


def test_iter_dataset_read_kwargs_reach_pyarrow(files, grain_parquet):
    ours = list(ParquetIterDataset(files[1], memory_map=True))
    _assert_same_elements(ours, list(grain_parquet(files[1], memory_map=True)))


@pytest.mark.parametrize("step", [0, 1, 2, 4])
def test_iter_dataset_restores_across_libraries(files, grain_parquet, step):
    ours, theirs = iter(ParquetIterDataset(files[0])), iter(grain_parquet(files[0]))
    for _ in range(step):
        next(ours), next(theirs)
    mine, reference = iter(ParquetIterDataset(files[0])), iter(grain_parquet(files[0]))
    mine.set_state(theirs.get_state())
    reference.set_state(ours.get_state())
    _assert_same_elements(list(mine), list(reference))


@pytest.mark.parametrize("step", [0, 3, 7, 10])
def test_iter_dataset_several_files_restore_across_libraries(files, grain_parquet, step):
    ours, theirs = iter(ParquetIterDataset(files)), iter(grain_parquet(files))
    for _ in range(step):
        next(ours), next(theirs)
    mine, reference = iter(ParquetIterDataset(files)), iter(grain_parquet(files))
    mine.set_state(theirs.get_state())
    reference.set_state(ours.get_state())
    _assert_same_elements(list(mine), list(reference))


def test_iter_dataset_checkpoint_at_every_step(files):
    assert_equal_output_after_checkpoint(ParquetIterDataset(files[0]))


def test_iter_dataset_set_slice_keeps_files(files, grain_parquet):
    ours, theirs = ParquetIterDataset(files), grain_parquet(files)
    ours.set_slice(slice(1, 2))
    theirs.set_slice(slice(1, 2))
    _assert_same_elements(list(ours), list(theirs))
    assert [r["text"] for r in ours] == TEXT[1]


def test_iter_dataset_several_files_interleave_as_grain(files, grain_parquet):
    ours, theirs = iter(ParquetIterDataset(files)), iter(grain_parquet(files))
    for _ in range(10):
        _assert_same_elements([next(ours)], [next(theirs)])
        assert ours.get_state() == theirs.get_state()
    assert_equal_output_after_checkpoint(ParquetIterDataset(files))


def test_iter_dataset_bad_state_names_the_file(files):
    it = iter(ParquetIterDataset(files[0]))
    with pytest.raises(ValueError, match="part-0.parquet"):
        it.set_state({"row_group": 7, "index_within_row_group": 0})
    with pytest.raises(ValueError, match="row_group"):
        it.set_state({"rows": 1})
    assert next(it)["text"] == TEXT[0][0]  # the failed restores changed nothing


def test_iter_dataset_missing_file_is_named(tmp_path, grain_parquet):
    missing = str(tmp_path / "nope.parquet")
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        iter(ParquetIterDataset(missing))
    with pytest.raises(FileNotFoundError):
        iter(grain_parquet(missing))


def test_iter_dataset_files_as_elements_of_a_map_dataset(files):
    ds = gl.MapDataset.source(files).map(ParquetIterDataset)
    assert [[r["text"] for r in per_file] for per_file in ds] == TEXT


def test_iter_dataset_in_two_workers_reads_one_file_each(files, no_leaks):
    pooled = ParquetIterDataset(files).mp_prefetch(gl.MultiprocessingOptions(num_workers=2))
    # Worker w reads files[w::2]; the pool takes one element from each in turn.
    assert [r["text"] for r in pooled] == [t for pair in zip(*TEXT) for t in pair]


# -- ParquetDataSource ------------------------------------------------------------


def test_source_reads_rows_across_files_and_row_groups(files):
    source = ParquetDataSource(files)
    assert len(source) == 10
    flat = [r for f in files for r in ParquetIterDataset(f)]  # grain's row format
    _assert_same_elements([source[k] for k in range(10)], flat)
    keys = [9, 0, 3, 3, 7, 4]
    _assert_same_elements(source.__getitems__(keys), [flat[k] for k in keys])
    assert source[7]["vec"].dtype == np.float32 and source[7]["id"] == 12


def test_source_reads_each_row_group_once_per_batch(files, monkeypatch):
    source = ParquetDataSource(files, cached_row_groups=1)
    reads = []
    original = pq.ParquetFile.read_row_group

    def counting(self, i, *args, **kwargs):
        reads.append(i)
        return original(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counting)
    source.__getitems__([1, 5, 0, 6, 1, 0])  # row groups: 0 of file 0, 0 of file 1
    assert sorted(reads) == [0, 0]


def test_source_columns_select_and_missing_column_is_named(files):
    source = ParquetDataSource(files, columns=["id"])
    assert source[6] == {"id": 11}
    with pytest.raises(ValueError, match="'nope'"):
        ParquetDataSource(files, columns=["nope"])


def test_source_repr_is_stable_and_names_columns(files):
    a, b = ParquetDataSource(files, columns=["text"]), ParquetDataSource(list(files), columns=["text"])
    assert repr(a) == repr(b)
    assert repr(a).startswith("ParquetDataSource(hash_of_paths=") and "['text']" in repr(a)
    assert repr(a) != repr(ParquetDataSource(files[:1], columns=["text"]))


def test_source_errors(files, tmp_path):
    source = ParquetDataSource(files)
    with pytest.raises(IndexError, match="10"):
        source[10]
    with pytest.raises(IndexError):
        source.__getitems__([0, -1])
    with pytest.raises(FileNotFoundError, match="gone.parquet"):
        ParquetDataSource([files[0], str(tmp_path / "gone.parquet")])
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match="junk.parquet"):
        ParquetDataSource(str(tmp_path / "junk.parquet"))
    with pytest.raises(ValueError, match="empty"):
        ParquetDataSource([])


def test_source_pickles_without_open_files(files):
    source = ParquetDataSource(files)
    source[3]
    clone = pickle.loads(cloudpickle.dumps(source))
    assert "_files" not in source.__getstate__()  # what pickling sends
    _assert_same_elements([clone[3]], [source[3]])
    source.close()
    _assert_same_elements([source[8]], [clone[8]])  # reopens after close


@pytest.mark.parametrize("workers", [0, 2])
def test_source_through_data_loader_restores(files, workers, no_leaks):
    source = ParquetDataSource(files, columns=["id", "text"])

    def loader():
        return gl.DataLoader(
            data_source=source,
            sampler=gl.IndexSampler(len(source), gl.NoSharding(), shuffle=True, num_epochs=1, seed=3),
            operations=[gl.Batch(2)],
            worker_count=workers,
        )

    it = iter(loader())
    first = [next(it)["id"].tolist() for _ in range(2)]
    state = it.get_state()
    rest = [b["id"].tolist() for b in it]
    assert sorted(sum(first + rest, [])) == sorted(r["id"] for r in ParquetIterDataset(files[0])) + list(range(10, 15))
    again = iter(loader())
    again.set_state(state)
    assert [b["id"].tolist() for b in again] == rest


def test_source_through_map_dataset_checkpoint(files):
    ds = gl.MapDataset.source(ParquetDataSource(files)).shuffle(seed=1).map(lambda r: r["id"]).to_iter_dataset()
    assert_equal_output_after_checkpoint(ds)


def test_source_reads_from_threads_in_parallel_with_one_handle_each(files):
    import threading
    from concurrent import futures

    source = ParquetDataSource(files, cached_row_groups=1)
    flat = [r for f in files for r in ParquetIterDataset(f)]
    barrier = threading.Barrier(4)

    def read(key):
        barrier.wait()  # all four read at once
        return source.__getitems__([key, (key + 5) % 10])

    with futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(read, [0, 3, 6, 9]))
    for key, got in zip([0, 3, 6, 9], results):
        _assert_same_elements(got, [flat[key], flat[(key + 5) % 10]])
    handles = [pf for idle in source._files.values() for pf in idle]
    assert len(handles) == len({id(pf) for pf in handles})  # no handle given back twice
    source.close()
    assert source._files == {}


def test_batched_reads_take_any_integer_keys(files):
    source = ParquetDataSource(files, columns=["id"])
    as_list = [r["id"] for r in source.__getitems__([np.int32(2), 7])]
    assert as_list == [r["id"] for r in source.__getitems__(range(2, 8, 5))] == [2, 12]
    assert source.__getitems__([]) == []
    with pytest.raises(TypeError):
        source.__getitems__([1.5])


def test_grain_data_loader_over_the_source_gives_the_same_batches_and_states(files, grain_ref):
    """grain's DataLoader takes any source: same batches, same state, restorable both ways."""

    def loader(lib):
        source = ParquetDataSource(files, columns=["id", "vec"])
        return lib.DataLoader(
            data_source=source,
            sampler=lib.IndexSampler(len(source), lib.NoSharding(), shuffle=True, num_epochs=2, seed=9),
            operations=[lib.Batch(3)],
            worker_count=0,
        )

    def plain(batches):
        return [(b["id"].tolist(), b["vec"].tolist()) for b in batches]

    theirs, ours = iter(loader(grain_ref)), iter(loader(gl))
    head = [next(theirs) for _ in range(3)]
    assert plain(head) == plain(next(ours) for _ in range(3))
    state_theirs, state_ours = theirs.get_state(), ours.get_state()
    assert state_ours == state_theirs  # the JSON, byte for byte
    assert "ParquetDataSource(hash_of_paths=" in state_ours.decode()
    rest = plain(theirs)
    assert len(rest) == 4 and plain(ours) == rest  # 20 records in batches of 3: 7 batches
    mine = iter(loader(gl))
    mine.set_state(state_theirs)
    reference = iter(loader(grain_ref))
    reference.set_state(state_ours)
    assert plain(mine) == plain(reference) == rest
