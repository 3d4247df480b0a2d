"""Code pickled by value for workers keeps its file name (grainlike.core.pickling)."""

import pickle
import traceback

import cloudpickle
import pytest

import grainlike as gl
from grainlike.core import pickling


def _closure():
    def inner(y):
        return 1 // y

    return lambda x: inner(x - 2)


def test_functions_pickled_by_value_keep_their_file_and_lines():
    fn = _closure()  # a lambda and a nested function: cloudpickle pickles both by value
    plain = cloudpickle.loads(cloudpickle.dumps(fn))
    assert plain.__code__.co_filename == "<dynamic-code>"  # what cloudpickle alone does
    kept = pickle.loads(pickling.dumps(fn))
    assert kept.__code__.co_filename == __file__
    assert kept.__code__.co_firstlineno == fn.__code__.co_firstlineno
    assert kept(7) == fn(7) == 0
    with pytest.raises(ZeroDivisionError) as info:
        kept(2)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert [(f.filename, f.name) for f in frames[-2:]] == [(__file__, "<lambda>"), (__file__, "inner")]


@pytest.mark.timeout(60)
def test_a_transform_failing_in_a_worker_names_the_users_file_in_the_traceback(no_leaks):
    ds = gl.MapDataset.range(4).map(_closure()).to_iter_dataset()
    ds = ds.mp_prefetch(gl.MultiprocessingOptions(num_workers=1))
    with pytest.raises(ZeroDivisionError) as info:
        list(ds)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert (__file__, "inner") in [(f.filename, f.name) for f in frames]
    assert "<dynamic-code>" not in "".join(traceback.format_exception(info.value))
