"""``SharedMemoryArray`` against grain 0.2.18's: the same segments, metadata and semantics.

An array written by one library is mapped by the other from its metadata, so
code handing arrays between processes keeps working with either.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from grainlike.multiprocessing import SharedMemoryArray, SharedMemoryArrayMetadata
from tests.helpers.leaks import wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def grain_mp(grain_ref):
    del grain_ref
    import grain.multiprocessing

    return grain.multiprocessing


def _segment_exists(name: str) -> bool:
    return os.path.exists(f"/dev/shm/{name.lstrip('/')}")


def _freed(name: str) -> bool:
    # Deletion may run in a background thread: grain's workers enable that.
    return wait_until(lambda: not _segment_exists(name))


def test_metadata_is_grains_dataclass(grain_mp):
    theirs = [f.name for f in dataclasses.fields(grain_mp.SharedMemoryArrayMetadata)]
    assert [f.name for f in dataclasses.fields(SharedMemoryArrayMetadata)] == theirs
    a = SharedMemoryArrayMetadata("x", (2,), np.dtype(np.int32))
    assert a == SharedMemoryArrayMetadata("x", (2,), np.dtype(np.int32))
    assert hash(a) == hash(SharedMemoryArrayMetadata("x", (2,), np.dtype(np.int32)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.name = "y"


@pytest.mark.parametrize("writer", ["grain", "grainlike"])
def test_one_library_maps_the_others_array(grain_mp, writer):
    make, read = (
        (grain_mp.SharedMemoryArray, SharedMemoryArray)
        if writer == "grain"
        else (SharedMemoryArray, grain_mp.SharedMemoryArray)
    )
    source = make((3, 4), dtype=np.float32)
    source[:] = np.arange(12, dtype=np.float32).reshape(3, 4)
    metadata = source.metadata
    assert (metadata.shape, np.dtype(metadata.dtype)) == ((3, 4), np.dtype(np.float32))
    mapped = read.from_metadata(metadata)
    assert type(mapped) is read
    np.testing.assert_array_equal(mapped, source)
    mapped[0, 0] = 100  # the same memory, not a copy
    assert source[0, 0] == 100
    name = metadata.name
    mapped.unlink_on_del()
    del mapped, source
    assert _freed(name)


def test_array_semantics_match_grains(grain_mp):
    for cls in (grain_mp.SharedMemoryArray, SharedMemoryArray):
        a = cls((2, 3), dtype=np.int64)
        a[:] = 3
        view = a[1]
        # Views keep the segment; computed results are plain arrays and scalars.
        assert type(view) is cls and view.shm is a.shm
        assert type(a + 1) is np.ndarray
        assert type(a.sum()) is np.int64
        assert repr(a.sum()) == repr(np.int64(18))
        name = a.metadata.name
        a.unlink_on_del()
        del a, view
        assert _freed(name)


def test_pickling_sends_the_name_not_the_data():
    a = SharedMemoryArray((1000,), dtype=np.uint8)
    a[:] = 7
    payload = pickle.dumps(a)
    assert len(payload) < 400
    b = pickle.loads(payload)
    assert b.shm.name == a.shm.name and b.tolist() == a.tolist()
    b.unlink_on_del()
    del a, b


def test_another_process_maps_the_array(tmp_path):
    a = SharedMemoryArray((4,), dtype=np.int32)
    a[:] = [1, 2, 3, 4]
    code = textwrap.dedent(
        f"""
        import numpy as np
        from grainlike.multiprocessing import SharedMemoryArray, SharedMemoryArrayMetadata
        b = SharedMemoryArray.from_metadata(SharedMemoryArrayMetadata({a.shm.name!r}, (4,), np.int32))
        b *= 10
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    assert a.tolist() == [10, 20, 30, 40]
    a.unlink_on_del()
    name = a.shm.name
    del a
    assert _freed(name)


def test_close_and_unlink_frees_a_segment_nobody_opened():
    a = SharedMemoryArray((8,), dtype=np.float64)
    metadata = a.metadata
    del a
    assert _segment_exists(metadata.name)
    metadata.close_and_unlink_shm()
    assert _freed(metadata.name)


def test_async_deletion_frees_segments():
    SharedMemoryArray.enable_async_del(num_threads=1, max_outstanding_requests=2)
    try:
        names = []
        for _ in range(5):
            a = SharedMemoryArray((16,), dtype=np.int8)
            a.unlink_on_del()
            names.append(a.shm.name)
            del a
        assert wait_until(lambda: not any(_segment_exists(n) for n in names))
    finally:
        pool = SharedMemoryArray._del_thread_pool
        SharedMemoryArray._del_thread_pool = None
        SharedMemoryArray._outstanding_del_requests = None
        pool.close()
        pool.join()


def test_metadata_of_a_copy_names_the_problem():
    a = SharedMemoryArray((2,), dtype=np.int8)
    copied = a.copy()
    with pytest.raises(ValueError, match="no named shared-memory segment"):
        copied.metadata  # noqa: B018
    a.unlink_on_del()
    del a


def test_copy_to_shm_and_back_as_grains_helpers(grain_mp):
    del grain_mp
    from grain._src.python.ipc import shared_memory_array as theirs

    from grainlike.core.shared_memory_array import copy_to_shm, open_from_shm, unlink_shm

    struct = {"a": np.arange(10, dtype=np.int32), "b": [np.zeros((2, 3)), 7], "small": np.arange(2, dtype=np.int8),
              "empty": np.zeros(0), "strided": np.arange(8)[::2], "objects": np.array([None, 1], dtype=object)}
    sent = copy_to_shm(struct, min_size=8)
    # The same leaves are copied as by grain: contiguous, non-empty arrays of
    # min_size bytes or more, without objects.
    kinds = lambda s: {k: [type(x).__name__ for x in (v if isinstance(v, list) else [v])] for k, v in s.items()}  # noqa: E731
    reference = theirs.copy_to_shm(struct, min_size=8)
    assert kinds(sent) == kinds(reference)
    theirs.unlink_shm(reference)
    names = [sent["a"].name, sent["b"][0].name]
    assert all(_segment_exists(n) for n in names)
    # Each opened array frees its segment when deleted.
    mine = open_from_shm(sent)
    np.testing.assert_array_equal(mine["b"][0], struct["b"][0])
    assert type(mine["a"]) is SharedMemoryArray and mine["b"][1] == 7 and mine["small"] is struct["small"]
    del mine
    assert all(_freed(n) for n in names)
    # A structure nobody opens is freed by unlink_shm.
    sent = copy_to_shm({"a": struct["a"]})
    unlink_shm(sent)
    assert not _segment_exists(sent["a"].name)


def test_arrays_from_workers_are_shared_memory_arrays_without_a_name():
    # What grain users do with a SharedMemoryArray from its workers works on grainlike's,
    # which live in anonymous memory (no named segment).
    import grainlike

    ds = grainlike.MapDataset.range(4).map(lambda i: np.full((128, 128), i, np.float32)).to_iter_dataset()
    it = iter(ds.batch(2).mp_prefetch(grainlike.MultiprocessingOptions(num_workers=1)))
    batches = list(it)
    it.close()
    a = batches[1]
    assert type(a) is SharedMemoryArray and a.shm is None
    assert float(a[1, 0, 0]) == 3.0  # valid after the iterator closed, for as long as it is held
    with pytest.raises(ValueError, match="no named shared-memory segment"):
        a.metadata  # noqa: B018
    a.unlink_on_del()  # nothing to do: the memory goes with its last array
    copied = pickle.loads(pickle.dumps(a))
    assert type(copied) is SharedMemoryArray and copied.shm is None
    np.testing.assert_array_equal(copied, a)
    assert type(a + 1) is np.ndarray and type(a[0]) is SharedMemoryArray
    # A named copy is sent by name, as grain's arrays are.
    named = SharedMemoryArray(a.shape, a.dtype)
    named[...] = a
    mapped = SharedMemoryArray.from_metadata(named.metadata)
    np.testing.assert_array_equal(mapped, a)
    mapped.unlink_on_del()
    name = named.metadata.name
    del named, mapped
    assert _freed(name)
