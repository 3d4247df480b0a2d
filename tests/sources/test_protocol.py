"""RandomAccessDataSource protocol and RangeDataSource."""

import pickle

import numpy as np
import pytest

from grainlike.sources import RandomAccessDataSource, RangeDataSource, SupportsBatchedRead


@pytest.mark.parametrize("start,stop,step", [(0, 10, 2), (10, 0, -2), (0, 0, 1), (3, 4, 5), (-5, 5, 3)])
def test_range_matches_python_range(start, stop, step):
    source = RangeDataSource(start, stop, step)
    expected = list(range(start, stop, step))
    assert len(source) == len(expected)
    assert [source[i] for i in range(len(source))] == expected
    assert source.__getitems__(list(range(len(source)))[::-1]) == expected[::-1]


def test_range_repr_and_pickle():
    source = RangeDataSource(1, 9, 2)
    assert repr(source) == "RangeDataSource(start=1, stop=9, step=2)"
    assert repr(pickle.loads(pickle.dumps(source))) == repr(source)


def test_range_numpy_keys():
    assert RangeDataSource(0, 10, 1)[np.int64(3)] == 3


@pytest.mark.parametrize("key", [-1, 5, 100])
def test_range_out_of_range(key):
    with pytest.raises(IndexError, match=f"Index {key} out of range for 5"):
        RangeDataSource(0, 5, 1)[key]


def test_range_invalid_arguments():
    with pytest.raises(AssertionError, match="step can't be zero"):
        RangeDataSource(0, 10, 0)
    with pytest.raises(AssertionError, match="length can't be negative"):
        RangeDataSource(10, 0, 1)


def test_protocol_is_structural():
    class Squares:
        def __len__(self):
            return 3

        def __getitem__(self, key):
            return key * key

    class Batched(Squares):
        def __getitems__(self, keys):
            return [self[k] for k in keys]

    assert isinstance(Squares(), RandomAccessDataSource)
    assert not isinstance(Squares(), SupportsBatchedRead)
    assert isinstance(Batched(), SupportsBatchedRead)
    assert isinstance(RangeDataSource(0, 3, 1), SupportsBatchedRead)
    assert not isinstance(object(), RandomAccessDataSource)
