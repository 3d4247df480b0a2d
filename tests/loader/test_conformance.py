"""Every DataLoader restores exactly at every step: sources x workers x sharding x stages x samplers.

``assert_equal_output_after_checkpoint`` restores the state taken before each
output into a fresh iterator and compares the state and all remaining outputs.
The cases cover every pair of values of the five axes (``tests/helpers/pairwise``).
"""

from __future__ import annotations

import numpy as np
import pytest

import grainlike as grain
from grainlike.core.sampling import PaddedEpochSampler, RandomSampler
from grainlike.dataset.conformance import assert_equal_output_after_checkpoint
from grainlike.tools.convert import write_records
from tests.helpers.pairwise import pairwise

N = 7  # odd: partial batches, uneven shards, a dropped remainder
BATCH = 3
SEED = 5

AXES = {
    "source": ["range", "list", "memory_list", "memory_array", "memory_dict", "array_record"],
    "workers": [0, 1, 2, 3],
    "shard": ["none", "first_of_2", "second_of_2_drop"],
    "stage": ["map", "random_map", "filter", "map_with_index", "batch", "batch_drop", "batch_pad"],
    "sampler": ["index_shuffled", "index_2_epochs", "index_shuffled_2_epochs", "sequential", "random", "padded"],
}


def _valid(case):
    # A PaddedEpochSampler's padding is masked by Batch(pad=True) and nothing else.
    return not (case.get("sampler") == "padded" and case.get("stage", "batch_pad") != "batch_pad")


CASES = pairwise(AXES, _valid)


class Normalize(grain.MapTransform):
    """Every source's record ``k`` as ``{"k": k, "y": [k, k]}``."""

    def map(self, record):
        if isinstance(record, bytes):
            k = int(record)
        elif isinstance(record, str):
            k = int(record[1:])
        elif isinstance(record, dict):
            k = int(record["k"])
        elif isinstance(record, np.ndarray) and record.ndim == 1:
            k = int(record[0]) // 2
        else:
            k = int(record)
        return {"k": np.int64(k), "y": np.full(2, k, np.float32)}


class Double(grain.MapTransform):
    def map(self, x):
        return {**x, "k": x["k"] * 2 + 1}


class Draw(grain.RandomMapTransform):
    def random_map(self, x, rng):
        return {**x, "r": rng.integers(0, 1 << 30)}


class DropMultiplesOf3(grain.FilterTransform):
    def filter(self, x):
        return int(x["k"]) % 3 != 0


class WithIndex(grain.MapWithIndexTransform):
    def map_with_index(self, index, x):
        return {**x, "i": np.int64(index)}


STAGES = {
    "map": lambda: [Double()],
    "random_map": lambda: [Draw()],
    "filter": lambda: [DropMultiplesOf3()],
    "map_with_index": lambda: [WithIndex()],
    "batch": lambda: [grain.Batch(BATCH)],
    "batch_drop": lambda: [grain.Batch(BATCH, drop_remainder=True)],
    "batch_pad": lambda: [grain.Batch(BATCH, pad=True)],
}

SHARDS = {
    "none": grain.NoSharding(),
    "first_of_2": grain.ShardOptions(0, 2),
    "second_of_2_drop": grain.ShardOptions(1, 2, drop_remainder=True),
}


def _sampler(name, shard, workers):
    if name == "index_shuffled":
        return grain.IndexSampler(N, shard, shuffle=True, num_epochs=1, seed=SEED)
    if name == "index_2_epochs":
        return grain.IndexSampler(N, shard, shuffle=False, num_epochs=2, seed=SEED)
    if name == "index_shuffled_2_epochs":
        return grain.IndexSampler(N, shard, shuffle=True, num_epochs=2, seed=SEED)
    if name == "sequential":
        return grain.SequentialSampler(N, shard, seed=SEED)
    if name == "random":
        return RandomSampler(N, shard, num_samples=N, seed=SEED)
    return PaddedEpochSampler(
        N, BATCH, worker_count=workers, shard_options=shard, shuffle=True, num_epochs=2, seed=SEED
    )


@pytest.fixture
def source(request, tmp_path):
    kind = request.param
    if kind == "range":
        yield grain.RangeDataSource(0, N, 1)
    elif kind == "list":
        yield list(range(N))
    elif kind == "array_record":
        paths = write_records([b"%d" % k for k in range(N)], N, str(tmp_path / "records"),
                              progress=False, encode=lambda b: b)
        yield grain.ArrayRecordDataSource(paths)
    else:
        if kind == "memory_list":
            data = [f"r{k}" for k in range(N)]
        elif kind == "memory_array":
            data = np.arange(2 * N, dtype=np.int32).reshape(N, 2)
        else:
            data = {"k": np.arange(N), "y": np.zeros((N, 3), np.float32)}
        src = grain.InMemoryDataSource(data)
        yield src
        src.close()


def _id(case):
    return "-".join(str(v) for v in case.values())


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "source, case",
    [pytest.param(c["source"], c, id=_id(c)) for c in CASES],
    indirect=["source"],
)
def test_restores_at_every_step(source, case, no_leaks):
    shard = SHARDS[case["shard"]]
    workers = case["workers"]
    extra = {"warm_start": False} if workers else {}
    loader = grain.DataLoader(
        data_source=source,
        sampler=_sampler(case["sampler"], shard, workers),
        operations=[Normalize()] + STAGES[case["stage"]](),
        worker_count=workers,
        shard_options=shard,
        **extra,
    )
    assert_equal_output_after_checkpoint(loader)


def test_the_cases_cover_every_value_and_every_valid_pair():
    for axis, values in AXES.items():
        assert {c[axis] for c in CASES} == set(values), axis
    names = list(AXES)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            seen = {(c[a], c[b]) for c in CASES}
            for va in AXES[a]:
                for vb in AXES[b]:
                    if _valid({a: va, b: vb}):
                        assert (va, vb) in seen, (a, va, b, vb)
