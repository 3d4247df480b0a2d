"""DataLoader in process: order, batching, length, state, errors, lifecycle."""

import functools
import json
import sys

import numpy as np
import pytest

import grainlike as grain
from grainlike.dataset.conformance import assert_equal_output_after_checkpoint


def _loader(n=10, ops=(), epochs=1, shuffle=False, seed=0, **kw):
    return grain.DataLoader(
        data_source=grain.RangeDataSource(0, n, 1),
        sampler=grain.IndexSampler(n, grain.NoSharding(), shuffle=shuffle, num_epochs=epochs, seed=seed),
        operations=list(ops),
        **kw,
    )


class Double(grain.MapTransform):
    def map(self, x):
        return x * 2


class AddIndex(grain.MapWithIndexTransform):
    def map_with_index(self, index, x):
        return (index, x)


class Even(grain.FilterTransform):
    def filter(self, x):
        return x % 2 == 0


class Boom(grain.MapTransform):
    def map(self, x):
        if x == 4:
            raise KeyError(f"no such thing as {x}")
        return x


def test_reads_in_order_and_batches():
    assert [b.tolist() for b in _loader(7, [Double(), grain.Batch(3)])] == [[0, 2, 4], [6, 8, 10], [12]]
    assert [b.tolist() for b in _loader(7, [grain.Batch(3, drop_remainder=True)])] == [[0, 1, 2], [3, 4, 5]]


def test_map_with_index_gets_the_global_index():
    out = list(_loader(5, [AddIndex()], epochs=2, shuffle=True, seed=1))
    assert [i for i, _ in out] == list(range(10))
    assert sorted(x for _, x in out[:5]) == list(range(5))


@pytest.mark.parametrize(
    "ops, expected",
    [
        ([], 10),
        ([grain.Batch(3)], 4),
        ([grain.Batch(3, drop_remainder=True)], 3),
        ([grain.Batch(2), grain.Batch(2)], 3),
    ],
)
def test_len_counts_outputs_of_a_finite_loader(ops, expected):
    loader = _loader(10, ops)
    assert len(loader) == expected == len(list(loader))


def test_len_refuses_infinite_and_filtered_loaders():
    with pytest.raises(TypeError, match="infinite"):
        len(_loader(5, epochs=None))
    with pytest.raises(TypeError, match="FilterTransform"):
        len(_loader(5, [Even()]))


def test_transform_error_keeps_its_type_and_names_record_and_transform():
    it = iter(_loader(10, [Boom()]))
    got = [next(it) for _ in range(4)]
    assert got == [0, 1, 2, 3]
    with pytest.raises(KeyError) as info:
        next(it)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "Boom" in notes and "record_key 4" in notes and "global index 4" in notes


def test_batch_error_names_the_records():
    class Ragged(grain.MapTransform):
        def map(self, x):
            return np.zeros(x % 2 + 1)

    with pytest.raises(ValueError) as info:
        list(_loader(4, [Ragged(), grain.Batch(4)]))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "Batch(batch_size=4" in notes and "[0, 1, 2, 3]" in notes


def test_state_roundtrip_mid_epoch_and_across_epochs():
    loader = _loader(9, [Double(), grain.Batch(2)], epochs=3, shuffle=True, seed=4)
    assert_equal_output_after_checkpoint(loader)  # restores before every batch
    it = iter(loader)
    list(it)
    at_end = iter(loader)
    at_end.set_state(it.get_state())
    assert list(at_end) == []


def test_initial_state_matches_reference_format():
    state = json.loads(iter(_loader(5)).get_state())
    assert state == {
        "version": 2,
        "last_seen_indices": {"0": -1},
        "last_worker_index": -1,
        "worker_count": 0,
        "sampler": repr(_loader(5).sampler),
        "data_source": "RangeDataSource(start=0, stop=5, step=1)",
    }


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda s: b"not json", "not valid JSON"),
        (lambda s: s[: len(s) // 2], "not valid JSON"),
        (lambda s: b"[1, 2]", "JSON object"),
        (lambda s: _edit(s, worker_count=2), "last_seen_indices must map each worker"),
        (lambda s: _edit(s, sampler="IndexSampler(other)"), "Sampler in checkpoint"),
        (lambda s: _edit(s, data_source="Other()"), "DataSource in checkpoint"),
        (lambda s: _edit(s, version=99), "version 99"),
        (lambda s: _edit(s, last_seen_indices={"0": 10**6}), "out of range"),
        (lambda s: _edit(s, last_seen_indices={"0": -5}), "out of range"),
        (lambda s: _edit(s, last_seen_indices={"0": "x"}), "must be an int"),
        (lambda s: _edit(s, last_seen_indices={"1": 0}), "last_seen_indices"),
        (lambda s: _edit(s, last_worker_index=7), "last_worker_index"),
        (lambda s: _drop(s, "sampler"), "missing"),
    ],
)
def test_bad_state_is_refused_and_iterator_stays_usable(mutate, fragment):
    loader = _loader(10, epochs=1)
    it = iter(loader)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    good = it.get_state()
    with pytest.raises(ValueError, match=fragment) as info:
        it.set_state(mutate(good))
    assert isinstance(info.value, grain.InvalidStateError)
    assert next(it) == 3
    assert it.get_state() != good


def test_set_state_rejects_non_bytes():
    with pytest.raises(TypeError, match="bytes"):
        iter(_loader()).set_state(12)


def _edit(state, **changes):
    d = json.loads(state)
    d.update(changes)
    return json.dumps(d).encode()


def _drop(state, key):
    d = json.loads(state)
    del d[key]
    return json.dumps(d).encode()


def test_iterator_is_a_context_manager_and_close_is_final():
    loader = _loader(5)
    with iter(loader) as it:
        assert next(it) == 0
    with pytest.raises(RuntimeError, match="closed"):
        next(it)
    it.close()  # idempotent


def test_iterator_str_shows_state():
    assert str(iter(_loader(3))).startswith("PyGrainDatasetIterator(state={")


def test_worker_count_none_means_cpu_count_and_negative_is_refused():
    import os

    assert _loader(3, worker_count=None).worker_count == os.cpu_count()
    with pytest.raises(ValueError):
        _loader(3, worker_count=-1)


def test_missing_shard_options_is_refused_for_samplers_without_them():
    class MySampler:
        def __len__(self):
            return 3

        def __getitem__(self, i):
            if i >= 3:
                raise IndexError(i)
            return grain.RecordMetadata(index=i, record_key=i)

    with pytest.raises(ValueError, match="shard options"):
        grain.DataLoader(data_source=[1, 2, 3], sampler=MySampler())
    loader = grain.DataLoader(data_source=[1, 2, 3], sampler=MySampler(), shard_options=grain.NoSharding())
    assert list(loader) == [1, 2, 3]


def test_non_transform_operation_is_refused_with_its_name():
    # A callable is a legacy grain Operation (a function of the record stream);
    # anything else is refused up front.
    with pytest.raises(TypeError, match=r"operations\[1\] is a int"):
        _loader(3, [Double(), 42])


def test_import_loads_no_heavy_modules():
    import subprocess

    code = (
        "import sys, grainlike, grainlike.python; "
        "heavy = [m for m in ('jax', 'orbax', 'tensorflow_datasets', 'cv2', 'tensorflow', 'grain', 'prometheus_client') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_grainlike_python_exports_the_same_names():
    import grainlike.python as gp

    for name in grain.__all__:
        if name == "experimental":
            # As in grain, grain.python.experimental is a module of its own.
            assert gp.experimental.__name__ == "grainlike.python.experimental"
            continue
        assert getattr(gp, name) is getattr(grain, name)


def _local_source(kind, tmp_path, n=600):
    if kind == "RangeDataSource":
        return grain.RangeDataSource(0, n, 1)
    if kind == "list":
        return list(range(n))
    if kind == "numpy":
        return np.arange(n)
    if kind == "InMemoryDataSource":
        return grain.sources.InMemoryDataSource(list(range(n)))
    if kind == "ArrayRecord":
        from array_record.python.array_record_module import ArrayRecordWriter

        path = str(tmp_path / "d.array_record")
        w = ArrayRecordWriter(path, "group_size:1")
        for i in range(n):
            w.write(str(i).encode())
        w.close()
        return grain.ArrayRecordDataSource(path)
    if kind == "Parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = str(tmp_path / "d.parquet")
        pq.write_table(pa.table({"id": np.arange(n)}), path, row_group_size=100)
        return grain.sources.ParquetDataSource(path)
    assert kind == "declared local"
    return _CountingSource(n, declared_waits=False)


def _read_threads_seen_and_outputs(loader) -> tuple[set, list]:
    from tests.helpers.threads import new_read_threads, read_threads

    seen, outputs, before = set(), [], read_threads()
    for b in loader:
        seen |= new_read_threads(before)
        leaves = b.values() if isinstance(b, dict) else [b]
        outputs.append([np.asarray(x).tolist() for x in leaves])
    return seen, outputs


@pytest.mark.parametrize(
    "kind", ["RangeDataSource", "list", "numpy", "InMemoryDataSource", "ArrayRecord", "Parquet", "declared local"]
)
def test_local_sources_are_read_in_the_calling_thread_unless_read_options_ask(kind, tmp_path):
    source = _local_source(kind, tmp_path)
    sampler = grain.IndexSampler(600, grain.NoSharding(), shuffle=True, num_epochs=1, seed=0)
    default = grain.DataLoader(data_source=source, sampler=sampler, operations=[grain.Batch(8)])
    explicit = grain.DataLoader(data_source=source, sampler=sampler, operations=[grain.Batch(8)],
                                read_options=grain.ReadOptions(num_threads=2))
    threads_default, out_default = _read_threads_seen_and_outputs(default)
    threads_explicit, out_explicit = _read_threads_seen_and_outputs(explicit)
    # Batched reads of memory and local files, in this thread.
    assert threads_default == set()
    # An explicit ReadOptions is used as given, as in grain.
    assert threads_explicit
    assert out_default == out_explicit


N_WAITING = 192


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_waiting_source_is_read_in_threads_with_the_records_and_states_of_one_thread(workers):
    from tests.helpers import waiting

    def run(delay, read_options=None):
        loader = grain.DataLoader(
            data_source=waiting.WaitingSource(N_WAITING, delay),
            sampler=grain.IndexSampler(N_WAITING, grain.NoSharding(), shuffle=True, num_epochs=1, seed=2),
            operations=[grain.Batch(8)],
            worker_count=workers,
            read_options=read_options,
        )
        it = iter(loader)
        batches, states = [], []
        for b in it:
            batches.append(b)
            states.append(it.get_state())
        return batches, states

    waiting.reset()
    threaded, threaded_states = run(0.01)
    waiting.reset()
    one_thread, one_thread_states = run(0, grain.ReadOptions(num_threads=0))
    assert waiting.keys(threaded, "key") == waiting.keys(one_thread, "key")
    assert sorted(k for b in waiting.keys(threaded, "key") for k in b) == list(range(N_WAITING))
    assert threaded_states == one_thread_states
    # Each process's 10 ms reads overlapped: grain's 16 read threads, not one.
    assert waiting.max_overlap(threaded) >= 4
    assert waiting.max_overlap(one_thread) == 1


class _CountingSource:
    """Records the size of every batched read; records of ``record_bytes`` bytes."""

    def __init__(self, n, record_bytes=8, declared_waits=None):
        self.n, self.record_bytes = n, record_bytes
        self.reads = []
        if declared_waits is not None:
            self.waits = declared_waits

    def __len__(self):
        return self.n

    def __getitem__(self, key):
        return self.__getitems__([key])[0]

    def __getitems__(self, keys):
        self.reads.append(len(keys))
        return [np.full(self.record_bytes, k % 251, np.uint8) for k in keys]

    def __repr__(self):
        return f"_CountingSource(n={self.n})"


@pytest.mark.parametrize("record_bytes", [8, 1 << 20, 4 << 20])
def test_reads_are_batched_by_count_for_small_records_and_by_bytes_for_big_ones(record_bytes):
    from grainlike.loader import records

    # The reading stage's caps: so many records, and about so many bytes (at least one).
    largest_read = max(1, min(records.MAX_CHUNK, records.CHUNK_BYTES // record_bytes))
    source = _CountingSource(600, record_bytes)
    sampler = grain.IndexSampler(600, grain.NoSharding(), shuffle=True, num_epochs=1, seed=0)
    loader = grain.DataLoader(data_source=source, sampler=sampler, operations=[grain.Batch(8)],
                              read_options=grain.ReadOptions(num_threads=0))
    assert sum(1 for _ in loader) == 75
    assert sum(source.reads) == 600
    # A small first read, to learn the record size before reading many.
    assert source.reads[0] <= largest_read
    assert max(source.reads) == largest_read


@pytest.mark.parametrize("op", [lambda x: x * 2, abs, functools.partial(max, 0)])
def test_a_plain_function_in_operations_is_refused_when_the_loader_is_built(op):
    with pytest.raises(TypeError, match=r"operations\[1\] is the function .*MapTransform"):
        grain.DataLoader(
            data_source=grain.RangeDataSource(0, 4, 1),
            sampler=grain.IndexSampler(4, grain.NoSharding(), shuffle=False, num_epochs=1),
            operations=[grain.Batch(2), op],
        )


def test_a_generator_function_is_still_a_legacy_operation():
    def double_all(records):
        for r in records:
            yield grain.Record(r.metadata, r.data * 2)

    loader = grain.DataLoader(
        data_source=grain.RangeDataSource(0, 4, 1),
        sampler=grain.IndexSampler(4, grain.NoSharding(), shuffle=False, num_epochs=1),
        operations=[double_all],
    )
    assert [int(x) for x in loader] == [0, 2, 4, 6]
