"""``TfDataIterDataset``: a tf.data pipeline read as a stream, restored by skipping.

The expected elements are TensorFlow's own (``as_numpy_iterator()``); the
pipeline shuffles with a seed and ``reshuffle_each_iteration=False``, which a
restore by skipping needs (the module docstring says why).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import grainlike as grain
from grainlike.experimental import TfDataIterDataset, assert_equal_output_after_checkpoint, multithread_prefetch

tf = pytest.importorskip("tensorflow")

N = 12


def make_pipeline():
    ds = tf.data.Dataset.from_tensor_slices(
        {"x": np.arange(N, dtype=np.int64), "y": np.arange(2 * N, dtype=np.float32).reshape(N, 2)}
    )
    ds = ds.map(lambda e: {**e, "x": e["x"] * 10})
    return ds.shuffle(N, seed=5, reshuffle_each_iteration=False)


def _expected() -> list:
    return list(make_pipeline().as_numpy_iterator())


@pytest.mark.parametrize("dataset", [make_pipeline, make_pipeline()], ids=["function", "dataset"])
def test_yields_the_pipelines_elements_and_restores_at_every_step(dataset):
    ds = TfDataIterDataset(dataset)
    np.testing.assert_equal(list(ds), _expected())
    assert_equal_output_after_checkpoint(ds)
    assert_equal_output_after_checkpoint(ds.batch(5))


def test_state_counts_the_elements_consumed():
    it = iter(TfDataIterDataset(make_pipeline))
    next(it), next(it)
    assert it.get_state() == {"elements_consumed": 2}
    it.set_state({"elements_consumed": 10})
    np.testing.assert_equal(list(it), _expected()[10:])
    with pytest.raises(ValueError, match="elements_consumed"):
        it.set_state({"elements_consumed": -1})


def test_threads_read_it_as_it_is():
    ds = multithread_prefetch(TfDataIterDataset(make_pipeline()), num_threads=2, buffer_size=2)
    assert sorted(int(e["x"]) for e in ds) == [10 * i for i in range(N)]


@pytest.mark.timeout(300)
def test_workers_each_read_their_shard_and_restore():
    # Each worker imports TensorFlow and builds the pipeline: one restore, not one per step.
    ds = TfDataIterDataset(make_pipeline).mp_prefetch(grain.MultiprocessingOptions(num_workers=2))
    expected = _expected()
    # Worker w reads dataset.shard(2, w); the outputs alternate between workers.
    order = [expected[i] for pair in zip(range(0, N, 2), range(1, N, 2)) for i in pair]
    it = iter(ds)
    first = [next(it) for _ in range(5)]
    state = it.get_state()
    rest = list(it)
    it.close()
    np.testing.assert_equal(first + rest, order)
    restored = iter(ds)
    restored.set_state(state)
    np.testing.assert_equal(list(restored), rest)
    restored.close()


def test_a_dataset_object_does_not_pickle_and_says_what_to_pass():
    with pytest.raises(TypeError, match=r"pass a function that builds the dataset, TfDataIterDataset\(make_pipeline\)"):
        pickle.dumps(TfDataIterDataset(make_pipeline()))
    assert str(pickle.loads(pickle.dumps(TfDataIterDataset(make_pipeline)))) == "TfDataIterDataset(make_pipeline)"


def test_anything_else_is_refused_naming_it():
    with pytest.raises(TypeError, match="TfDataIterDataset takes a tf.data.Dataset or a function that returns one, got list"):
        TfDataIterDataset([1, 2])
    with pytest.raises(TypeError, match=r"the result of <lambda>\(\) must be a tf.data.Dataset, got list"):
        list(TfDataIterDataset(lambda: [1, 2]))
