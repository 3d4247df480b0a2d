"""The Orbax handler restores a checkpoint of another number of processes in this one.

The checkpoint's files are written here by loaders sharded as the processes of
a 2-process job would be; this process (JAX process 0 of 1) restores them.
"""

from __future__ import annotations

import asyncio
import collections

import numpy as np
import pytest

import grainlike as grain
from grainlike.core.errors import InvalidStateError

RECORDS = 12


def _loader(index: int, count: int, workers: int = 0) -> grain.DataLoader:
    return grain.DataLoader(
        data_source=grain.RangeDataSource(0, RECORDS, 1),
        sampler=grain.IndexSampler(RECORDS, grain.ShardOptions(index, count), shuffle=True, num_epochs=1, seed=2),
        operations=[grain.Batch(2)],
        worker_count=workers,
    )


def _values(batches) -> list:
    return [int(v) for b in batches for v in np.asarray(b).reshape(-1)]


@pytest.fixture
def two_process_checkpoint(tmp_path):
    before = []
    for i in range(2):
        with iter(_loader(i, 2, workers=0)) as it:
            before += _values([next(it), next(it)])
            (tmp_path / f"process_{i}-of-2.json").write_bytes(it.get_state())
    return tmp_path, before


@pytest.mark.timeout(60)
def test_handler_restores_a_device_iterator_from_two_processes_files(two_process_checkpoint, no_leaks):
    pytest.importorskip("orbax.checkpoint")
    from grainlike import checkpoint
    from grainlike.jax.device_iterator import DeviceIterator

    directory, before = two_process_checkpoint
    with DeviceIterator(iter(_loader(0, 1, workers=2))) as it:
        checkpoint.CheckpointHandler().restore(directory, item=it)
        after = _values(it)
    assert collections.Counter(before + after) == collections.Counter(range(RECORDS))
    # Nothing was written: the next save writes this job's own file.
    assert sorted(p.name for p in directory.iterdir()) == ["process_0-of-2.json", "process_1-of-2.json"]


@pytest.mark.timeout(60)
def test_dataset_iterator_restores_only_a_state_all_processes_share(tmp_path, no_leaks):
    from grainlike.experimental import ElasticIterator

    ds = grain.MapDataset.range(20)
    shards = [ElasticIterator(ds, 4, grain.ShardOptions(i, 2)) for i in range(2)]
    for i, it in enumerate(shards):
        next(it)
        asyncio.run(_save(it, tmp_path))  # writes process_0-of-1.json
        (tmp_path / "process_0-of-1.json").rename(tmp_path / f"process_{i}-of-2.json")
    restored = ElasticIterator(ds, 4, grain.NoSharding())
    asyncio.run(_load(restored, tmp_path))
    assert [np.asarray(b).tolist() for b in restored] == [[4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19]]

    next(shards[1])  # the processes' states now differ
    asyncio.run(_save(shards[1], tmp_path))
    (tmp_path / "process_0-of-1.json").replace(tmp_path / "process_1-of-2.json")
    with pytest.raises(InvalidStateError, match="not all the same"):
        asyncio.run(_load(ElasticIterator(ds, 4, grain.NoSharding()), tmp_path))


async def _save(it, directory):
    from grainlike import checkpoint

    await (await checkpoint.save_state_async(it, directory))


async def _load(it, directory):
    from grainlike import checkpoint

    await (await checkpoint.load_state_async(it, directory))
