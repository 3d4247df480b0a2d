"""For the errors grain 0.2.18 raises on bad input, grainlike raises grain's type or a subclass.

Each case runs the same code against ``grain.python`` and ``grainlike``; the
error grainlike raises must be an instance of the type grain raised, so an
``except`` clause written for grain catches it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import grainlike


def _loader(lib, **overrides):
    kwargs = dict(
        data_source=lib.RangeDataSource(0, 8, 1),
        sampler=lib.IndexSampler(8, lib.NoSharding(), shuffle=False, num_epochs=1, seed=0),
    )
    kwargs.update(overrides)
    return lib.DataLoader(**kwargs)


def _restore(lib, state):
    iter(_loader(lib)).set_state(state)


def _restore_dataset(make, **changes):
    """Sets a state of the iterator ``make()`` builds, with ``changes`` to its keys."""
    it = iter(make())
    state = it.get_state()
    state.update(changes)
    it.set_state(state)


def _range_iter(lib):
    return lib.MapDataset.range(5).to_iter_dataset()


def _mixed(lib):
    return lib.IterDataset.mix([_range_iter(lib), _range_iter(lib)])


def _zipped(lib):
    return lib.experimental.ZipIterDataset([_range_iter(lib), _range_iter(lib)])


class _SamplerWithoutShardOptions:
    def __len__(self):
        return 3

    def __getitem__(self, index):
        raise IndexError(index)


def _failing_map(lib):
    class Fail(lib.MapTransform):
        def map(self, x):
            return 1 // 0

    return Fail()


_MISSING_FILE = "/nonexistent/grainlike-test/missing.array_record"

_OTHER_PIPELINE_STATE = json.dumps(
    {
        "version": 2,
        "last_seen_indices": {"0": -1},
        "last_worker_index": -1,
        "worker_count": 3,
        "sampler": "another sampler",
        "data_source": "another source",
    }
).encode()

CASES = {
    # DataLoader arguments
    "negative worker_count": lambda lib: _loader(lib, worker_count=-1),
    "negative worker_buffer_size": lambda lib: _loader(lib, worker_buffer_size=-1),
    "no shard options": lambda lib: lib.DataLoader(data_source=[1, 2], sampler=_SamplerWithoutShardOptions()),
    "operation that is not callable": lambda lib: next(iter(_loader(lib, operations=[42]))),
    "Batch of size 0": lambda lib: _loader(lib, operations=[lib.Batch(0)]),
    "BatchOperation of size 0": lambda lib: lib.BatchOperation(0),
    "transform raises": lambda lib: next(iter(_loader(lib, operations=[_failing_map(lib)]))),
    "MapOperation raises": lambda lib: next(iter(_loader(lib, operations=[lib.MapOperation(lambda x: 1 // 0)]))),
    "different shapes batched": lambda lib: next(iter(_loader(
        lib, data_source=[np.zeros(1), np.zeros(2)] * 4,
        sampler=lib.SequentialSampler(8, lib.NoSharding()), operations=[lib.Batch(2)]))),
    "len of an endless loader": lambda lib: len(_loader(
        lib, sampler=lib.IndexSampler(8, lib.NoSharding(), num_epochs=None))),
    "load with num_epochs=0": lambda lib: lib.load([1, 2, 3], num_epochs=0),
    # samplers
    "IndexSampler num_records=0": lambda lib: lib.IndexSampler(0, lib.NoSharding()),
    "IndexSampler num_epochs=0": lambda lib: lib.IndexSampler(3, lib.NoSharding(), num_epochs=0),
    "shuffle without seed": lambda lib: lib.IndexSampler(3, lib.NoSharding(), shuffle=True),
    "float seed": lambda lib: lib.IndexSampler(3, lib.NoSharding(), shuffle=True, seed=1.5),
    "negative seed": lambda lib: lib.IndexSampler(3, lib.NoSharding(), seed=-1),
    "seed over 32 bits": lambda lib: lib.IndexSampler(3, lib.NoSharding(), seed=2**33),
    "IndexSampler index past the end": lambda lib: lib.IndexSampler(3, lib.NoSharding(), num_epochs=1)[3],
    "IndexSampler negative index": lambda lib: lib.IndexSampler(3, lib.NoSharding(), num_epochs=1)[-1],
    "SequentialSampler num_records=0": lambda lib: lib.SequentialSampler(0, lib.NoSharding()),
    "SequentialSampler index past the end": lambda lib: lib.SequentialSampler(3, lib.NoSharding())[3],
    # sharding
    "shard_count=0": lambda lib: lib.ShardOptions(0, 0),
    "shard_index past shard_count": lambda lib: lib.ShardOptions(2, 2),
    "negative shard_index": lambda lib: lib.ShardOptions(-1, 2),
    # sources
    "RangeDataSource step 0": lambda lib: lib.RangeDataSource(0, 5, 0),
    "RangeDataSource of negative length": lambda lib: lib.RangeDataSource(5, 0, 1),
    "RangeDataSource key past the end": lambda lib: lib.RangeDataSource(0, 5, 1)[5],
    "RangeDataSource negative key": lambda lib: lib.RangeDataSource(0, 5, 1)[-1],
    "InMemoryDataSource without elements or name": lambda lib: lib.InMemoryDataSource(),
    "ArrayRecordDataSource of a missing file": lambda lib: lib.ArrayRecordDataSource(_MISSING_FILE),
    "ArrayRecordDataSource of missing files": lambda lib: lib.ArrayRecordDataSource([_MISSING_FILE] * 2),
    # grain opens a "file[start:end]" path only when it reads.
    "ArrayRecordDataSource read from a missing file": lambda lib: lib.ArrayRecordDataSource(
        f"{_MISSING_FILE}[0:3]")[0],
    # options
    "ReadOptions negative num_threads": lambda lib: lib.ReadOptions(num_threads=-1),
    "ReadOptions negative prefetch_buffer_size": lambda lib: lib.ReadOptions(prefetch_buffer_size=-1),
    # state
    "state of another pipeline": lambda lib: _restore(lib, _OTHER_PIPELINE_STATE),
    # Dataset iterator states
    "Dataset state that is a list": lambda lib: iter(_range_iter(lib)).set_state([1]),
    "Dataset state that is None": lambda lib: iter(_range_iter(lib)).set_state(None),
    "Dataset state without next_index": lambda lib: iter(_range_iter(lib)).set_state({}),
    "Dataset next_index that is a str": lambda lib: _restore_dataset(lambda: _range_iter(lib), next_index="2"),
    "Dataset next_index that is None": lambda lib: _restore_dataset(lambda: _range_iter(lib), next_index=None),
    "Dataset negative next_index": lambda lib: _restore_dataset(lambda: _range_iter(lib), next_index=-1),
    "Dataset next_index past the end": lambda lib: _restore_dataset(lambda: _range_iter(lib), next_index=6),
    "Dataset next_index of a batch that is a str": lambda lib: _restore_dataset(
        lambda: _range_iter(lib).batch(2), next_index="2"),
    "Dataset next_index under a map that is a str": lambda lib: _restore_dataset(
        lambda: _range_iter(lib).map(lambda x: x), next_index="2"),
    "mix state whose parents are not a list": lambda lib: _restore_dataset(lambda: _mixed(lib), parents=3),
    "mix state whose parent state is not a dict": lambda lib: _restore_dataset(lambda: _mixed(lib), parents=[3, 3]),
    "zip state whose parents are not a list": lambda lib: _restore_dataset(lambda: _zipped(lib), parents=3),
    # Malformed values (tests/reliability/test_bad_iterator_state.py fuzzes the rest).
    "Dataset next_index past int64": lambda lib: _restore_dataset(lambda: _range_iter(lib), next_index=10**30),
    "interleave next_index_in_datasets past int64": lambda lib: _restore_dataset(
        lambda: _interleaved(lib), next_index_in_datasets=10**30),
    "interleave exhausted that is an int": lambda lib: _restore_dataset(lambda: _interleaved(lib), exhausted=3),
    "interleave iterators_in_use_states that is None": lambda lib: _restore_dataset(
        lambda: _interleaved(lib), iterators_in_use_states=None),
    "window shuffle state without window_index": lambda lib: iter(_window_shuffled(lib)).set_state(
        {"parent_window_start_state": {"next_index": 0}, "pos_in_window": 0}),
    "ElasticIterator state that is None": lambda lib: iter(_elastic(lib)).set_state(None),
    "ElasticIterator state without global_next_index": lambda lib: iter(_elastic(lib)).set_state({}),
}


def _interleaved(lib):
    return lib.experimental.InterleaveIterDataset(lib.MapDataset.source([_range_iter(lib)] * 2), cycle_length=2)


def _window_shuffled(lib):
    return lib.experimental.WindowShuffleIterDataset(_range_iter(lib), window_size=2, seed=1)


def _elastic(lib):
    return lib.experimental.ElasticIterator(lib.MapDataset.range(8), global_batch_size=2, shard_options=lib.NoSharding())


# grain's InMemoryDataSource.__del__ fails on an object its __init__ refused.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("case", sorted(CASES))
def test_error_is_grains_type_or_a_subclass(grain_ref, case):
    with pytest.raises(Exception) as theirs:
        CASES[case](grain_ref)
    with pytest.raises(Exception) as ours:
        CASES[case](grainlike)
    assert isinstance(ours.value, type(theirs.value)), (
        f"grain raises {type(theirs.value).__name__}: {theirs.value}; grainlike raises "
        f"{type(ours.value).__name__}: {ours.value}"
    )
