"""``grain.loader(...).shard(mesh)``: global batches over a mesh, each process reading its rows.

The multi-process test runs ``mesh_shard_job.py`` as two JAX processes on the
CPU (one device each, gloo), started and, past the timeout, ended by pid by
``run_job``. Expected batches come from the same builder without sharding.
"""

from __future__ import annotations

import pathlib
import types

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

import grainlike as grain
from grainlike.core.batch_slice import BatchSliceSampler
from grainlike.jax.device_iterator import process_data_shards
from tests.helpers.jax_processes import run_job
from tests.jax import mesh_shard_job

SCRIPT = pathlib.Path(mesh_shard_job.__file__)
TIMEOUT_S = 120


def _plain(batch):
    return {k: np.asarray(v).tolist() for k, v in batch.items()}


def _unsharded_batches():
    return [_plain(b) for b in mesh_shard_job.builder(grain).build()]


def _mesh():
    return Mesh(np.array(jax.devices()), ("data",))


# -- BatchSliceSampler: which positions each process reads ---------------------------------


@pytest.mark.parametrize("records, batch, shards", [(44, 8, 2), (40, 8, 4), (12, 6, 3), (10, 4, 1)])
def test_slices_of_all_shards_make_each_global_batch_of_the_order(records, batch, shards):
    order = grain.IndexSampler(records, shuffle=True, num_epochs=1, seed=7)
    expected = [order[i].record_key for i in range(records)]
    slices = [BatchSliceSampler(order, batch, shards, s, s + 1) for s in range(shards)]
    keys = [[s[i].record_key for i in range(len(s))] for s in slices]
    rows, full = batch // shards, records // batch
    got = []
    for k in range(full):
        for shard_keys in keys:
            got += shard_keys[k * rows: (k + 1) * rows]
    for shard_keys in keys:  # the last, short global batch
        got += shard_keys[full * rows:]
    assert got == expected


def test_a_slice_keeps_the_index_and_rng_of_the_position_without_sharding():
    order = grain.IndexSampler(20, shuffle=True, num_epochs=1, seed=1)
    sliced = BatchSliceSampler(order, 4, 2, 1, 2)
    for i in range(len(sliced)):
        m = sliced[i]
        g = (i // 2) * 4 + 2 + i % 2
        assert (m.index, m.record_key) == (g, order[g].record_key)
        assert m.rng.integers(1 << 30) == order[g].rng.integers(1 << 30)
    # Many positions at once, vectorised: no RecordMetadata per record.
    located = sliced.locate(np.arange(4))
    assert located.metadata is None and located.indices.tolist() == [2, 3, 6, 7]


def test_a_last_batch_that_does_not_split_evenly_is_refused_unless_dropped():
    order = grain.IndexSampler(45, num_epochs=1)
    with pytest.raises(ValueError, match="last global batch holds 5 of the 45 records.*2 data shards"):
        BatchSliceSampler(order, 8, 2, 0, 1)
    assert len(BatchSliceSampler(order, 8, 2, 0, 1, drop_remainder=True)) == 5 * 4
    with pytest.raises(ValueError, match="global batch size 6 does not split over 4"):
        BatchSliceSampler(order, 6, 4, 0, 1)


# -- which shards a process holds ------------------------------------------------------------


def _fake_mesh(owners, axis_names):
    devices = np.vectorize(lambda p: types.SimpleNamespace(process_index=int(p)), otypes=[object])(
        np.array(owners))
    return types.SimpleNamespace(devices=devices, axis_names=axis_names)


def test_process_shards_follow_the_data_axis_and_ignore_the_others():
    # 2 processes x 2 devices; "data" across processes, "model" within each.
    mesh = _fake_mesh([[0, 0], [1, 1]], ("data", "model"))
    assert [process_data_shards(mesh, "data", p) for p in (0, 1)] == [(0, 1, 2), (1, 2, 2)]
    # "model" spans the processes: both hold the one data shard.
    assert process_data_shards(mesh, "model", 1) == (0, 2, 2)
    mesh = _fake_mesh([[0, 1], [0, 1]], ("data", "model"))
    assert process_data_shards(mesh, "data", 1) == (0, 2, 2)
    # Several data axes are flattened in the order given.
    mesh = _fake_mesh([[0, 0], [1, 1]], ("replica", "data"))
    assert process_data_shards(mesh, ("replica", "data"), 1) == (2, 4, 4)


def test_process_shards_that_are_not_adjacent_or_unequal_are_refused():
    with pytest.raises(ValueError, match=r"holds shards \[0, 2\].*not consecutive"):
        process_data_shards(_fake_mesh([0, 1, 0, 1], ("data",)), "data", 0)
    with pytest.raises(ValueError, match="different numbers of shards"):
        process_data_shards(_fake_mesh([0, 0, 0, 1], ("data",)), "data", 0)
    with pytest.raises(ValueError, match=r"data axis 'batch' is not an axis of the mesh.*\('data',\)"):
        process_data_shards(_fake_mesh([0, 1], ("data",)), "batch", 0)


# -- the builder, one process -----------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_one_device_mesh_gives_the_unsharded_batches_as_global_arrays(workers):
    loader = mesh_shard_job.builder(grain).workers(workers).shard(_mesh()).build()
    with iter(loader) as it:
        batches = list(it)
    assert all(isinstance(v, jax.Array) for b in batches for v in b.values())
    assert batches[0]["x"].sharding.spec == jax.sharding.PartitionSpec("data")
    assert [_plain(b) for b in batches] == _unsharded_batches()
    assert len(loader) == len(batches) == 6


def test_restore_mid_epoch_with_workers_continues_identically():
    loader = mesh_shard_job.builder(grain).workers(2).shard(_mesh(), "data").build()
    with iter(loader) as it:
        next(it), next(it)
        state = it.get_state()
        rest = [_plain(b) for b in it]
    with iter(loader) as it:
        it.set_state(state)
        assert [_plain(b) for b in it] == rest == _unsharded_batches()[2:]


def test_shard_dispatches_on_shard_options_or_mesh():
    source = list(range(10))
    one_shard = grain.loader(source).shard(grain.ShardOptions(1, 2)).batch(2).build()
    explicit = grain.DataLoader(
        data_source=source,
        sampler=grain.IndexSampler(10, grain.ShardOptions(1, 2), num_epochs=1),
        operations=[grain.Batch(2)],
    )
    assert [b.tolist() for b in one_shard] == [b.tolist() for b in explicit] == [[5, 6], [7, 8], [9]]
    builder = grain.loader(source).batch(2)
    assert builder.shard(_mesh()).shard(grain.NoSharding()).mesh is None
    with pytest.raises(TypeError, match="takes a ShardOptions or a jax.sharding.Mesh, got 'data'"):
        builder.shard("data")
    with pytest.raises(TypeError, match="data_axis_name is Loadax's name for data_axis"):
        builder.shard(_mesh(), "data", data_axis_name="model")
    with pytest.raises(TypeError, match="a data axis goes with a jax.sharding.Mesh"):
        builder.shard(grain.NoSharding(), data_axis_name="data")
    with pytest.raises(ValueError, match="data axis 'batch' is not an axis of the mesh"):
        builder.shard(_mesh(), data_axis="batch")


def test_mesh_sharding_refuses_what_would_split_batches_unevenly():
    source, mesh = list(range(10)), _mesh()
    with pytest.raises(ValueError, match=r"needs one \.batch\(global_batch_size\), as the last"):
        grain.loader(source).shard(mesh).build()
    with pytest.raises(ValueError, match="cannot use the filter"):
        grain.loader(source).filter(lambda x: x > 2).batch(2).shard(mesh).build()
    with pytest.raises(ValueError, match="last global batch is short and pad=True"):
        grain.loader(source).batch(4, pad=True).shard(mesh).build()


# -- two JAX processes ----------------------------------------------------------------------


@pytest.mark.timeout(TIMEOUT_S + 30)
def test_two_processes_read_their_rows_of_the_unsharded_batches_with_any_worker_count(tmp_path):
    results = run_job(SCRIPT, 2, [], tmp_path, TIMEOUT_S)
    expected = _unsharded_batches()
    assert [len(b["x"]) for b in expected] == [8] * 5 + [4]
    for p, result in enumerate(results):
        assert result["process"] == p
        for workers in ("0", "2"):
            run = result["runs"][workers]
            assert run["global"] == expected, (p, workers)
            assert run["len"] == len(expected)
            assert run["restored"] == expected[2]
            for (start, stop, values), batch in zip(run["local"], expected):
                half = len(batch["x"]) // 2
                assert (start, stop) == (p * half, (p + 1) * half)
                assert values == batch["x"][start:stop]
        # A data axis of size 1: every process holds, and so reads, every row.
        assert result["replicated"] == {"shape": [8], "local": expected[0]["x"]}
