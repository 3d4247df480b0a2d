"""The DataLoader honours ``ShardOptions(drop_remainder=False)`` (grain's main branch).

Shard ``i`` of ``n`` reads the sampler's global indices ``i, i + n, ...``. grain
0.2.18 gives every shard ``len(sampler) // n`` of them whatever the option, so
the last ``len(sampler) % n`` indices are read by no shard; grain's main branch
(commit 5bad1a2) gives the first ``len(sampler) % n`` shards one more without
``drop_remainder``, so every global index is read by exactly one shard. Values
marked "grain main" are transcribed from ``test_data_loader_sharding_drop_remainder``
in grain's main branch (``grain/_src/python/data_loader_test.py``); the rest
follow from that rule, and tests/compat/test_shard_remainder_compat.py compares
with grain 0.2.18's DataLoader given main's shard length.
"""

import collections
import json

import pytest

import grainlike as grain
from grainlike.core.sharding import ShardOptions, strided_shard_size
from grainlike.dataset.conformance import assert_equal_output_after_checkpoint

pytestmark = pytest.mark.timeout(300)


class GlobalIndex(grain.MapWithIndexTransform):
    """(the sampler's global index, the record): which index each output came from."""

    def map_with_index(self, index, x):
        return (int(index), int(x))


def _sequential(shard_index, shard_count, drop, n=10):
    options = grain.ShardOptions(shard_index=shard_index, shard_count=shard_count, drop_remainder=drop)
    return grain.DataLoader(
        data_source=grain.RangeDataSource(0, n, 1),
        sampler=grain.SequentialSampler(num_records=n, shard_options=options),
    )


def test_grain_mains_own_case():
    # grain main: DataLoaderTest.test_data_loader_sharding_drop_remainder.
    assert list(_sequential(0, 3, False)) == [0, 3, 6, 9]
    assert list(_sequential(0, 3, True)) == [0, 3, 6]
    assert list(_sequential(1, 3, False)) == [1, 4, 7]


def test_the_remainder_goes_to_the_first_shards():
    assert [list(_sequential(i, 3, False)) for i in range(3)] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert [list(_sequential(i, 3, True)) for i in range(3)] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    assert [list(_sequential(i, 4, False, n=7)) for i in range(4)] == [[0, 4], [1, 5], [2, 6], [3]]
    # SequentialSampler with drop_remainder ends at 7 // 4 * 4 = 4 itself.
    assert [list(_sequential(i, 4, True, n=7)) for i in range(4)] == [[0], [1], [2], [3]]


@pytest.mark.parametrize(
    "total, count, expected_keep, expected_drop",
    [
        (10, 3, [4, 3, 3], [3, 3, 3]),
        (9, 3, [3, 3, 3], [3, 3, 3]),
        (7, 4, [2, 2, 2, 1], [1, 1, 1, 1]),
        (2, 4, [1, 1, 0, 0], [0, 0, 0, 0]),
        (0, 2, [0, 0], [0, 0]),
    ],
)
def test_strided_shard_size(total, count, expected_keep, expected_drop):
    keep = [strided_shard_size(total, ShardOptions(i, count, False)) for i in range(count)]
    drop = [strided_shard_size(total, ShardOptions(i, count, True)) for i in range(count)]
    assert keep == expected_keep and drop == expected_drop
    assert sum(keep) == total
    assert keep == [len(range(i, total, count)) for i in range(count)]


def _index_loader(shard_index, shard_count, drop, *, n=10, epochs=1, shuffle=False, workers=0,
                  sampler_shards=True, ops=(GlobalIndex(),)):
    options = grain.ShardOptions(shard_index=shard_index, shard_count=shard_count, drop_remainder=drop)
    sampler_options = options if sampler_shards else grain.NoSharding()
    return grain.DataLoader(
        data_source=grain.RangeDataSource(0, n, 1),
        sampler=grain.IndexSampler(n, sampler_options, shuffle=shuffle, num_epochs=epochs, seed=5),
        operations=list(ops),
        worker_count=workers,
        shard_options=options,
    )


@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("n, count", [(10, 3), (11, 4), (5, 2)])
def test_one_epoch_reads_every_record_exactly_once_across_shards(n, count, shuffle, workers, no_leaks):
    outputs = []
    for i in range(count):
        loader = _index_loader(i, count, False, n=n, shuffle=shuffle, workers=workers)
        with iter(loader) as it:
            shard = list(it)
        assert len(shard) == strided_shard_size(n, loader.shard_options) == len(loader)
        outputs += shard
    assert sorted(x for _, x in outputs) == list(range(n))
    assert sorted(g for g, _ in outputs) == list(range(n))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_with_drop_remainder_the_last_records_are_read_by_no_shard(shuffle, workers, no_leaks):
    outputs = []
    for i in range(3):
        with iter(_index_loader(i, 3, True, shuffle=shuffle, workers=workers)) as it:
            shard = list(it)
        assert len(shard) == 3
        outputs += shard
    # IndexSampler with drop_remainder keeps records 0..8; global indices 0..8.
    assert sorted(x for _, x in outputs) == list(range(9))
    assert sorted(g for g, _ in outputs) == list(range(9))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_sampler_of_several_epochs_is_split_index_by_index(shuffle, workers, no_leaks):
    # The loader shards an unsharded sampler's stream of 3 epochs of 10 records:
    # every global index is read once, so every record once per epoch.
    outputs = []
    for i in range(4):
        with iter(_index_loader(i, 4, False, epochs=3, shuffle=shuffle, workers=workers, sampler_shards=False)) as it:
            outputs += list(it)
    assert sorted(g for g, _ in outputs) == list(range(30))
    assert collections.Counter(x for _, x in outputs) == {x: 3 for x in range(10)}
    by_epoch = collections.defaultdict(list)
    for g, x in outputs:
        by_epoch[g // 10].append(x)
    assert all(sorted(xs) == list(range(10)) for xs in by_epoch.values())


def test_a_sharded_sampler_of_several_epochs_reads_its_shard_by_position():
    # IndexSampler(10, shard i of 3, num_epochs=2) has 20 global indices, so the
    # loader's shards read 7, 7 and 6 positions (20 // 3, plus one for the first
    # 20 % 3 shards). Position p of shard i reads the sampler's global index
    # 3p + i, whose record is position p of that shard's records (4, 3, 3 of
    # them) repeated epoch after epoch: shard 0 stops inside its second epoch,
    # shard 1 reads one record of a third. This is grain main's behaviour
    # (tests/compat/test_shard_remainder_compat.py); with drop_remainder=True
    # every shard reads 6: two epochs of records 0-2, 3-5 and 6-8.
    def records(i, drop):
        return [x for _, x in _index_loader(i, 3, drop, epochs=2)]

    assert [records(i, False) for i in range(3)] == [
        [0, 1, 2, 3, 0, 1, 2],
        [4, 5, 6, 4, 5, 6, 4],
        [7, 8, 9, 7, 8, 9],
    ]
    assert [records(i, True) for i in range(3)] == [[0, 1, 2, 0, 1, 2], [3, 4, 5, 3, 4, 5], [6, 7, 8, 6, 7, 8]]


@pytest.mark.parametrize("batch", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_restores_at_every_step(workers, batch, no_leaks):
    ops = [GlobalIndex(), grain.Batch(2)] if batch else [GlobalIndex()]
    for i in (0, 2):  # a shard with the extra record and one without
        assert_equal_output_after_checkpoint(_index_loader(i, 3, False, n=14, shuffle=True, workers=workers, ops=ops))


def test_state_names_the_last_global_index_read():
    # grain's legacy state: last_seen_indices[str(w)] = shard_index - G + w * S +
    # next_position_w * G (G = max(W, 1) * S); after shard 0 of 3 read all of its
    # 4 positions that is 0 - 3 + 4 * 3 = 9, the global index of its extra record.
    it = iter(_index_loader(0, 3, False))
    assert len(list(it)) == 4
    state = json.loads(it.get_state())
    assert state["last_seen_indices"] == {"0": 9}
    assert state["last_worker_index"] == -1
    assert state["worker_count"] == 0
    assert state["sampler"] == (
        "IndexSampler(num_records=10, shard_options=ShardOptions(shard_index=0, shard_count=3, "
        "drop_remainder=False), shuffle=False, num_epochs=1, seed=5)"
    )
    it = iter(_index_loader(1, 3, False))
    list(it)
    assert json.loads(it.get_state())["last_seen_indices"] == {"0": 7}


def test_a_state_restores_on_another_worker_count(no_leaks):
    # Shard 0 of 3 over 11 records has 4 positions (the extra one at global
    # index 9): a state of 2 workers continues on 3 and on 0, every record once.
    full = [x for _, x in _index_loader(0, 3, False, n=11, shuffle=True)]
    assert len(full) == 4
    with iter(_index_loader(0, 3, False, n=11, shuffle=True, workers=2)) as it:
        head = [next(it)[1]]
        state = it.get_state()
    for workers in (3, 0):
        with iter(_index_loader(0, 3, False, n=11, shuffle=True, workers=workers)) as it:
            it.set_state(state)
            rest = [x for _, x in it]
        assert sorted(head + rest) == sorted(full)


def test_len_counts_the_extra_record():
    assert [len(_index_loader(i, 3, False, ops=[grain.Batch(2)])) for i in range(3)] == [2, 2, 2]
    assert [len(_index_loader(i, 3, False, n=13, ops=[grain.Batch(2)])) for i in range(3)] == [3, 2, 2]
    assert [len(_index_loader(i, 3, False, n=13, workers=2, ops=[grain.Batch(2)])) for i in range(3)] == [3, 2, 2]
    assert [len(_index_loader(i, 3, True, n=13)) for i in range(3)] == [4, 4, 4]


def test_inspect_counts_the_shards_extra_record(tmp_path):
    from grainlike.tools import inspect_cli

    it = iter(_index_loader(0, 3, False, shuffle=True))
    next(it)
    path = tmp_path / "process_0-of-3.json"
    path.write_bytes(it.get_state())
    text = inspect_cli.describe_path_restore(str(path), workers=2)
    # Shard 0 of 3 over 10 records has 4 positions, 1 of them delivered.
    assert "1 positions delivered, 3 remain" in text or "1 position delivered, 3 remain" in text
