"""InMemoryDataSource: encoding, reprs, shared-memory lifetime, child processes."""

import collections
import copy as copy_module
import errno
import gc
import math
import mmap
import multiprocessing
import os
import pickle
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
from multiprocessing import shared_memory

import numpy as np
import pytest

from grainlike.sources import InMemoryDataSource, RandomAccessDataSource, SharedMemoryDataSource
from tests.helpers.leaks import is_anonymous_segment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHM = "/dev/shm"
TIMEOUT = 60

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM), reason="needs /dev/shm")


def shm_names(prefix="grainlike_src_"):
    return {n for n in os.listdir(SHM) if n.startswith(prefix)}


def segment_exists(name):
    return os.path.exists(os.path.join(SHM, name))


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture(autouse=True)
def no_leftover_segments():
    before = shm_names() | shm_names("gltest_")
    yield
    gc.collect()
    assert wait_until(lambda: (shm_names() | shm_names("gltest_")) <= before, 5), (
        (shm_names() | shm_names("gltest_")) - before
    )


def unique_name():
    return f"gltest_{os.getpid()}_{secrets.token_hex(4)}"


def child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def run_python(tmp_path, script, stdin=b"", timeout=TIMEOUT):
    # A file, not `python -c`: spawned children must be able to re-import __main__.
    path = tmp_path / "scenario.py"
    path.write_text(textwrap.dedent(script))
    env = child_env()
    return subprocess.run(
        [sys.executable, str(path)],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


# ---------------------------------------------------------------------------
# Scalar sequences.

SCALARS = [
    0, -1, 2**63 - 1, -(2**63), 2**64, -(2**100), 1.5, -0.0, math.inf, "", "ü€", "a\x00",
    b"", b"\x00\x01\x00", None, True, False, 42,
]


def test_scalars_round_trip_with_types():
    with InMemoryDataSource(SCALARS) as source:
        assert len(source) == len(SCALARS)
        got = [source[i] for i in range(len(source))]
        assert got == SCALARS
        assert [type(x) for x in got] == [type(x) for x in SCALARS]
        assert math.copysign(1.0, source[7]) == -1.0  # -0.0 keeps its sign
        assert list(source) == SCALARS
        assert source.__getitems__([3, 0, 3]) == [SCALARS[3], SCALARS[0], SCALARS[3]]


def test_scalars_nan_and_numpy_scalars():
    with InMemoryDataSource([float("nan"), np.int32(7), np.float32(0.5), np.bool_(True)]) as source:
        assert math.isnan(source[0])
        assert source[1] == 7 and type(source[1]) is int
        assert source[2] == 0.5 and type(source[2]) is float
        assert source[3] is True


def test_scalars_negative_keys_and_out_of_range():
    with InMemoryDataSource([10, 20, 30]) as source:
        assert source[-1] == 30 and source[np.int64(1)] == 20
        with pytest.raises(IndexError, match="record_key 3 .* length 3"):
            source[3]
        with pytest.raises(IndexError, match="record_key -4 .* length 3"):
            source[-4]


def test_tuple_and_iterable_of_scalars():
    with InMemoryDataSource((1, "a")) as a, InMemoryDataSource(range(4)) as b:
        assert list(a) == [1, "a"]
        assert list(b) == [0, 1, 2, 3]


def test_empty_sequence():
    with InMemoryDataSource([]) as source:
        assert len(source) == 0
        assert list(source) == []
        with pytest.raises(IndexError):
            source[0]


def test_unsupported_elements():
    with pytest.raises(TypeError, match=r"element 1 has type dict"):
        InMemoryDataSource([1, {"a": 1}])
    with pytest.raises(TypeError, match=r"element 0 has type ndarray"):
        InMemoryDataSource([np.zeros(3), np.zeros(3)])
    with pytest.raises(TypeError, match="got str"):
        InMemoryDataSource("abc")
    with pytest.raises(ValueError, match="Elements or name must be provided"):
        InMemoryDataSource()


def test_is_a_random_access_source_and_alias():
    assert SharedMemoryDataSource is InMemoryDataSource
    with InMemoryDataSource([1]) as source:
        assert isinstance(source, RandomAccessDataSource)


# ---------------------------------------------------------------------------
# Arrays and trees.


def test_array_records_are_read_only_zero_copy_views():
    data = np.arange(6 * 4 * 3, dtype=np.float32).reshape(6, 4, 3)
    with InMemoryDataSource(data) as source:
        assert len(source) == 6
        for i in range(6):
            np.testing.assert_array_equal(source[i], data[i])
        first, again = source[2], source[2]
        assert first.dtype == np.float32 and first.shape == (4, 3)
        assert not first.flags.writeable
        assert np.shares_memory(first, again)  # both are views of the segment
        assert first.ctypes.data % 4 == 0
        with pytest.raises(ValueError):
            first[0, 0] = 1.0
        np.testing.assert_array_equal(source[-1], data[-1])
        with pytest.raises(IndexError, match="index 6 is out of bounds for axis 0 with size 6"):
            source[6]


def test_one_dimensional_array_gives_numpy_scalars():
    data = np.array([3, 1, 4], dtype=np.int16)
    with InMemoryDataSource(data) as source:
        assert source[1] == data[1] and type(source[1]) is np.int16


def test_unusual_dtypes_round_trip():
    structured = np.zeros(4, dtype=[("a", "<i4"), ("b", ">f8", (2,))])
    structured["a"] = [1, 2, 3, 4]
    big_endian = np.arange(5, dtype=">u4")
    non_contiguous = np.arange(40).reshape(10, 4)[::2, ::2]
    for data in (structured, big_endian, non_contiguous, np.zeros((0, 3))):
        with InMemoryDataSource(data) as source:
            assert len(source) == len(data)
            for i in range(len(data)):
                np.testing.assert_array_equal(source[i], data[i])
                assert np.asarray(source[i]).dtype == np.asarray(data[i]).dtype


def test_array_errors():
    with pytest.raises(TypeError, match="dtype object"):
        InMemoryDataSource(np.array([None, 1], dtype=object))
    with pytest.raises(ValueError, match="0-d array"):
        InMemoryDataSource(np.array(3.0))


Point = collections.namedtuple("Point", ["x", "y"])


def test_nested_tree_records():
    images = np.random.default_rng(0).integers(0, 255, (5, 4, 4), dtype=np.uint8)
    labels = np.arange(5)
    tree = {"image": images, "meta": (labels, {"w": labels * 2.0}), "pt": Point(labels, labels + 1)}
    with InMemoryDataSource(tree) as source:
        assert len(source) == 5
        rec = source[3]
        assert set(rec) == {"image", "meta", "pt"}
        np.testing.assert_array_equal(rec["image"], images[3])
        assert rec["meta"][0] == 3 and rec["meta"][1]["w"] == 6.0
        assert isinstance(rec["pt"], Point) and rec["pt"].y == 4
        assert not rec["image"].flags.writeable


def test_tuple_of_arrays_and_ordered_dict():
    a, b = np.arange(3), np.arange(3) * 10
    with InMemoryDataSource((a, b)) as source:
        assert source[2] == (2, 20)
    with InMemoryDataSource(collections.OrderedDict(b=b, a=a)) as source:
        rec = source[1]
        assert type(rec) is collections.OrderedDict and list(rec) == ["b", "a"]


def test_tree_errors():
    with pytest.raises(ValueError, match=r"same first dimension.*got \['a'\]: 3, \['b'\]: 4"):
        InMemoryDataSource({"a": np.zeros(3), "b": np.zeros(4)})
    with pytest.raises(ValueError, match="holds no arrays"):
        InMemoryDataSource({})
    with pytest.raises(TypeError, match=r"leaf \['a'\] has dtype object"):
        InMemoryDataSource({"a": np.array([object()])})


# ---------------------------------------------------------------------------
# repr / str.


def test_named_scalar_repr_is_grains_format():
    name = unique_name()
    with InMemoryDataSource([1, "a", b"b", None, 2.5, True], name=name) as source:
        assert repr(source) == f"SharedMemoryDataSource([1, 'a', b'b', None, 2.5, True], name='{name}')"
        assert str(source) == f"InMemoryDataSource(name={name}, len=6)"
        assert source.name == name
        assert repr(pickle.loads(pickle.dumps(source))) == repr(source)


def test_unnamed_repr_is_deterministic_content_hash():
    data = {"x": np.arange(10), "y": np.ones((10, 2), np.float32)}
    with InMemoryDataSource(data) as a, InMemoryDataSource(dict(data)) as b:
        assert repr(a) == repr(b)
        assert repr(a).startswith("SharedMemoryDataSource(len=10, sha1=")
        assert a.name is None and b.name is None  # anonymous memory has no name
        assert repr(pickle.loads(pickle.dumps(a))) == repr(a)
    with InMemoryDataSource(np.arange(10)) as c, InMemoryDataSource(np.arange(1, 11)) as d:
        assert repr(c) != repr(d)
    with InMemoryDataSource([1, 2]) as e, InMemoryDataSource([1.0, 2.0]) as f:
        assert repr(e) != repr(f)


# ---------------------------------------------------------------------------
# Lifetime in one process.


def source_fds():
    """This process's descriptors of anonymous memory (a source's, in these tests)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if is_anonymous_segment(os.readlink(f"/proc/self/fd/{fd}")):
                out.add(fd)
        except OSError:
            pass
    return out


def make(kind, data):
    return InMemoryDataSource(data, name=unique_name() if kind == "named" else None)


def make_watched(kind, data):
    """``(source, gone)``: ``gone()`` tells whether the owner released its name or descriptor."""
    before = source_fds()
    source = make(kind, data)
    if kind == "named":
        name = source.name
        return source, lambda: not segment_exists(name)
    mine = source_fds() - before
    assert len(mine) == 1  # one descriptor per source, none per record
    return source, lambda: not (mine & source_fds())


@pytest.mark.parametrize("kind", ["anonymous", "named"])
def test_views_outlive_close_and_reads_after_close_raise(kind):
    data = np.arange(12.0).reshape(4, 3)
    source, gone = make_watched(kind, data)
    kept = source[1]
    source.close()
    assert gone()
    gc.collect()
    np.testing.assert_array_equal(kept, data[1])  # mapping still alive through the view
    with pytest.raises(ValueError, match="is closed"):
        source[0]
    source.close()  # idempotent
    source.unlink()  # Grain's close(); unlink() sequence still works
    with pytest.raises(ValueError, match="cannot pickle a closed"):
        pickle.dumps(source)


@pytest.mark.parametrize("kind", ["anonymous", "named"])
def test_garbage_collecting_owner_releases_but_views_stay_valid(kind):
    source, gone = make_watched(kind, {"a": np.arange(100).reshape(50, 2)})
    rec = source[7]
    assert not gone()
    del source
    gc.collect()
    assert gone()
    assert rec["a"].tolist() == [14, 15]


def test_anonymous_memory_is_sealed_read_only_and_has_no_name():
    with InMemoryDataSource(np.arange(16).reshape(8, 2)) as source:
        assert source.name is None and str(source) == "InMemoryDataSource(name=None, len=8)"
        fd = source._fd
        # No process holding it can write: sealed (EPERM) or, without
        # memfd_create, a descriptor opened read-only (EBADF).
        with pytest.raises(OSError) as refused:
            os.pwrite(fd, b"x", 0)
        assert refused.value.errno in (errno.EPERM, errno.EBADF)
        with pytest.raises(OSError):  # nor map it writable
            mmap.mmap(fd, 64)
        record = source[3]
        with pytest.raises(ValueError, match="read-only"):
            record[0] = 0
        with pytest.raises(ValueError, match="WRITEABLE"):
            record.setflags(write=True)
        assert source[3].tolist() == [6, 7]


def test_without_anonymous_memory_the_error_says_to_pass_a_name(monkeypatch):
    from grainlike.core import memfd

    monkeypatch.setattr(memfd, "available", lambda: False)
    with pytest.raises(OSError, match="memfd_create.*pass name="):
        InMemoryDataSource([1, 2])
    with InMemoryDataSource([1, 2], name=unique_name()) as named:
        assert named[1] == 2


def test_named_pickle_is_small_and_copy_reads_lazily():
    data = np.ones((1024, 1024), np.float64)  # 8 MiB
    with InMemoryDataSource(data, name=unique_name()) as source:
        payload = pickle.dumps(source)
        assert len(payload) < 2000
        copy = pickle.loads(payload)
        assert copy._getter is None  # attaches on first read, not on unpickle
        assert len(copy) == 1024
        np.testing.assert_array_equal(copy[5], data[5])
        copy.close()  # a copy never unlinks
        assert segment_exists(source.name)
        assert source[0].sum() == 1024


def test_anonymous_pickle_outside_a_loader_carries_the_data_by_value():
    data = {"x": np.arange(4096.0).reshape(1024, 4), "y": np.arange(1024)}
    source = InMemoryDataSource(data)
    payload = pickle.dumps(source)
    assert len(payload) > data["x"].nbytes
    copy = pickle.loads(payload)
    assert repr(copy) == repr(source) and len(copy) == 1024
    source.close()  # the copy owns memory of its own
    assert not np.shares_memory(copy[3]["x"], data["x"])
    np.testing.assert_array_equal(copy[1023]["x"], data["x"][1023])
    assert not copy[3]["x"].flags.writeable
    copy.close()


@pytest.mark.parametrize("how", [copy_module.copy, copy_module.deepcopy], ids=["copy", "deepcopy"])
def test_copies_share_the_immutable_memory_and_outlive_the_original(how):
    data = np.arange(20).reshape(10, 2)
    source = InMemoryDataSource(data)
    twin = how(source)
    assert np.shares_memory(twin[4], source[4]) and repr(twin) == repr(source)
    source.close()
    np.testing.assert_array_equal(twin[9], data[9])
    again = pickle.loads(pickle.dumps(twin))  # by value, from the twin's own descriptor
    twin.close()
    np.testing.assert_array_equal(again[9], data[9])
    again.close()


def test_copy_of_closed_owner_raises_clear_error():
    source = InMemoryDataSource([1, 2, 3], name=unique_name())
    copy = pickle.loads(pickle.dumps(source))
    source.close()
    with pytest.raises(FileNotFoundError, match=f"segment '{source.name}' does not exist"):
        copy[0]


def test_attach_by_name():
    name = unique_name()
    with InMemoryDataSource(np.arange(6).reshape(3, 2), name=name) as owner:
        other = InMemoryDataSource(name=name)
        assert len(other) == 3 and other[2].tolist() == [4, 5]
        assert repr(other) == repr(owner)
        other.close()
        assert segment_exists(name)
        with pytest.raises(FileExistsError):
            InMemoryDataSource([1], name=name)
    assert not segment_exists(name)


def test_attach_to_foreign_segment_is_rejected():
    name = unique_name()
    shm = shared_memory.SharedMemory(name=name, create=True, size=64)
    try:
        with pytest.raises(ValueError, match="not created by InMemoryDataSource"):
            InMemoryDataSource(name=name)
    finally:
        shm.close()
        shm.unlink()


def test_concurrent_first_reads_from_threads():
    data = np.arange(1000).reshape(500, 2)
    with InMemoryDataSource(data, name=unique_name()) as owner:
        copy = pickle.loads(pickle.dumps(owner))
        errors, results = [], {}

        def read(t):
            try:
                results[t] = [int(copy[i][0]) for i in range(t, 500, 8)]
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=read, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        assert not errors
        assert all(results[t] == list(range(2 * t, 1000, 16)) for t in range(8))


# ---------------------------------------------------------------------------
# Child processes.


def _read_in_child(source, keys):
    out = []
    for k in keys:
        rec = source[k]
        out.append(rec.tolist() if isinstance(rec, np.ndarray) else rec)
    return out


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_children_read_without_destroying_segment(method):
    data = np.arange(40).reshape(20, 2)
    # Anonymous memory travels by value; the named segment by name.
    with InMemoryDataSource(data) as arrays, InMemoryDataSource(["x", 1, b"z", None], name=unique_name()) as scalars:
        ctx = multiprocessing.get_context(method)
        with ctx.Pool(2) as pool:
            got = pool.starmap_async(_read_in_child, [(arrays, [0, 19, 5]), (scalars, [0, 1, 2, 3])]).get(TIMEOUT)
        assert got == [[[0, 1], [38, 39], [10, 11]], ["x", 1, b"z", None]]
        # The children have exited: the segment is still there, both are readable.
        assert segment_exists(scalars.name)
        assert arrays[19].tolist() == [38, 39] and scalars[2] == b"z"


FORKED_OWNER_SCENARIO = """
import multiprocessing, os, sys
import numpy as np
from grainlike.sources import InMemoryDataSource

def read(source, queue):
    queue.put(int(source[3]))
    source.close()  # closes the child's inherited descriptor, not the parent's

if __name__ == "__main__":
    ctx = multiprocessing.get_context("fork")
    name = f"gltest_{os.getpid()}_forked"
    with InMemoryDataSource(np.arange(4), name=name) as named, InMemoryDataSource(np.arange(4)) as anonymous:
        queue = ctx.Queue()
        procs = [ctx.Process(target=read, args=(s, queue)) for s in (named, anonymous)]
        for proc in procs:
            proc.start()
        got = [queue.get(timeout=60) for _ in procs]
        for proc in procs:
            proc.join(60)
            assert proc.exitcode == 0, proc.exitcode
        assert got == [3, 3], got
        assert os.path.exists("/dev/shm/" + name), "a forked child's close() removed the parent's segment"
        assert named[3] == 3 and anonymous[3] == 3
    assert not os.path.exists("/dev/shm/" + name)
    print("ok")
"""


def test_forked_copy_of_owner_never_releases_the_parents_data(tmp_path):
    # Forked from a script of its own, as a user's program forks: forking the
    # test process would copy the threads earlier tests left running.
    result = run_python(tmp_path, FORKED_OWNER_SCENARIO)
    assert result.returncode == 0 and result.stdout.decode().split() == ["ok"], result.stderr.decode()


CHILD_SCENARIO = """
import multiprocessing, os, sys
import numpy as np
from grainlike.sources import InMemoryDataSource

def read(source):
    return int(source[3][1]), source.name

if __name__ == "__main__":
    source = InMemoryDataSource(np.arange(20).reshape(10, 2), name=f"gltest_{os.getpid()}_child")
    for method in ("spawn", "forkserver"):
        ctx = multiprocessing.get_context(method)
        proc_pool = ctx.Pool(1)
        assert proc_pool.apply_async(read, (source,)).get(60) == (7, source.name)
        proc_pool.close(); proc_pool.join()
        assert os.path.exists("/dev/shm/" + source.name), "child exit removed the segment"
    assert int(source[9][0]) == 18
    print(source.name)
    source.close()
    assert not os.path.exists("/dev/shm/" + source.name)
"""


def test_child_exit_leaves_segment_and_no_tracker_warning(tmp_path):
    result = run_python(tmp_path, CHILD_SCENARIO)
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    assert "resource_tracker" not in stderr and "leaked" not in stderr and "Traceback" not in stderr, stderr
    name = result.stdout.decode().strip()
    assert name.startswith("gltest_") and not segment_exists(name)


UNRELATED_READER = """
import pickle, sys
source = pickle.loads(sys.stdin.buffer.read())
print(source[1], source[2])
"""


@pytest.mark.parametrize("kind", ["anonymous", "named"])
def test_unrelated_process_reads_a_pickled_source_and_leaves_it_alone(tmp_path, kind):
    with make(kind, ["a", "bc", "def"]) as source:
        result = run_python(tmp_path, UNRELATED_READER, stdin=pickle.dumps(source))
        stderr = result.stderr.decode()
        assert result.returncode == 0, stderr
        assert result.stdout.decode().split() == ["bc", "def"]
        assert "leaked" not in stderr and "resource_tracker" not in stderr, stderr
        if kind == "named":
            assert segment_exists(source.name)
        assert source[2] == "def"


KILLED_OWNER = """
import sys, time
from grainlike.sources import InMemoryDataSource
source = InMemoryDataSource(list(range(100)), name=sys.argv[1])
print(source.name, flush=True)
time.sleep(600)
"""


def test_killed_owner_segment_is_reclaimed_by_resource_tracker():
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_OWNER, unique_name()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=child_env(),
    )
    try:
        name = proc.stdout.readline().decode().strip()
        assert name and segment_exists(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait(TIMEOUT)
        assert wait_until(lambda: not segment_exists(name), 20), f"{name} left in /dev/shm"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)
        proc.stdout.close()
        proc.stderr.close()


def test_attaching_never_registers_with_resource_tracker(monkeypatch):
    from multiprocessing import resource_tracker

    calls = []
    monkeypatch.setattr(resource_tracker, "register", lambda name, rtype: calls.append((name, rtype)))
    monkeypatch.setattr(resource_tracker, "unregister", lambda name, rtype: calls.append(("un", name, rtype)))
    with InMemoryDataSource([1, 2], name=unique_name()) as owner:
        assert calls == [("/" + owner.name, "shared_memory")]  # the owner registers: killed-owner cleanup
        copy = pickle.loads(pickle.dumps(owner))
        assert copy[1] == 2
        copy.close()
        del copy
        gc.collect()
        assert len(calls) == 1
    assert calls[-1] == ("un", "/" + owner.name, "shared_memory")


def test_scalar_round_trip_property():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(), st.binary()
    )

    @hypothesis.settings(max_examples=60, deadline=None)
    @hypothesis.given(st.lists(scalars, max_size=20))
    def check(elements):
        with InMemoryDataSource(elements) as source:
            got = list(source)
            assert got == elements
            assert [type(x) for x in got] == [type(x) for x in elements]
            copy = pickle.loads(pickle.dumps(source))
            assert list(copy) == elements

    check()
