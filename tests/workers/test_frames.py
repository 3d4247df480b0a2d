"""The binary framing of worker outputs (``grainlike.workers.frames``): what a pickle would deliver, exactly.

Each output is compared with its own pickle round trip (what the consumer got
before frames): the tree's node types, every leaf's type, dtype, shape,
order, writability and bytes, and the state.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import pickle
import struct
import typing

from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest

from grainlike.core.memfd import new_segment
from grainlike.core.shared_memory_array import SharedMemoryArray
from grainlike.workers import frames, shm
from grainlike.workers.messages import OUT, OUTS
from grainlike.workers.pool import WorkerPool

pytestmark = pytest.mark.timeout(120)

Point = collections.namedtuple("Point", ["x", "y"])


class Typed(typing.NamedTuple):
    image: np.ndarray
    label: np.ndarray


@dataclasses.dataclass
class Example:
    image: np.ndarray
    label: np.ndarray


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: np.ndarray
    b: typing.Any = None


class WithExtra:
    """A dataclass instance carrying an attribute that is no field: pickled, it keeps it."""


@dataclasses.dataclass
class Extra:
    a: np.ndarray

    def __post_init__(self):
        self.derived = self.a * 2


class Keyed(dict):
    """A dict subclass: pickling rebuilds it as its own class, with its attributes."""


def _assert_same(got, expected, path="output"):
    assert type(got) is type(expected), path
    if isinstance(expected, np.ndarray):
        assert got.dtype == expected.dtype, path
        assert got.dtype.isalignedstruct == expected.dtype.isalignedstruct, path
        assert got.shape == expected.shape, path
        assert got.flags.c_contiguous == expected.flags.c_contiguous, path
        assert got.flags.f_contiguous == expected.flags.f_contiguous, path
        assert got.flags.writeable == expected.flags.writeable, path
        if expected.dtype.hasobject:
            assert got.tolist() == expected.tolist(), path
        else:
            assert got.tobytes(order="A") == expected.tobytes(order="A"), path
        if isinstance(expected, np.ma.MaskedArray):
            assert got.mask.tolist() == expected.mask.tolist(), path
        if isinstance(expected, SharedMemoryArray):
            assert got.shm is None and not got._unlink_on_del, path
    elif isinstance(expected, dict):
        assert list(got) == list(expected), path
        for k in expected:
            _assert_same(got[k], expected[k], f"{path}[{k!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), path
        for i, (g, e) in enumerate(zip(got, expected)):
            _assert_same(g, e, f"{path}[{i}]")
    elif dataclasses.is_dataclass(expected):
        assert vars(got).keys() == vars(expected).keys(), path
        for k in vars(expected):
            _assert_same(getattr(got, k), getattr(expected, k), f"{path}.{k}")
    else:
        assert got == expected, path


def _through_frames(outputs, states=None, group=False, protocol=5):
    """Each output and state as the consumer gets them: recorded by one writer, read with one layout table."""
    writer = frames.Writer()
    layouts: dict = {}
    states = states or [{"next_index": i} for i in range(len(outputs))]
    records = [writer.record(s, o, protocol) for s, o in zip(states, outputs)]
    got = []
    for chunk in ([records] if group else [[r] for r in records]):
        buf = bytearray(frames.frame(frames.OUTS_KIND, chunk))
        kind, frame, offsets, segments = frames.message(buf, layouts)
        assert (kind, segments) == (OUTS, []) and frame is buf
        got += [(frames.state(buf, pos), frames.output(buf, pos, layouts)) for pos in offsets]
    return got, records


def _pickled(x, protocol=5):
    """``x`` as it arrived pickled: with protocol 5 (``OUTS``) or ``ForkingPickler``'s default (``OUT``)."""
    if protocol == 5:
        return pickle.loads(pickle.dumps(x, protocol=5))
    return pickle.loads(ForkingPickler.dumps(x))


def _fortran():
    return np.asfortranarray(np.arange(12.0).reshape(3, 4))


def _read_only():
    a = np.arange(6, dtype=np.int16)
    a.flags.writeable = False
    return a


LEAVES = {
    "0-d": lambda: np.array(3.5),
    "0-d shared": lambda: np.array(7, np.int32).view(SharedMemoryArray),
    "int64": lambda: np.arange(128),
    "shared": lambda: np.arange(10, dtype=np.uint8).view(SharedMemoryArray),
    "string": lambda: np.array(["grain", "like", ""]),
    "bytes": lambda: np.array([b"ab", b"c"]),
    "structured": lambda: np.array([(1, 2.5), (3, 4.5)], dtype=[("a", "<i4"), ("b", "<f8")]),
    "aligned structured": lambda: np.zeros(3, dtype=np.dtype([("a", "u1"), ("b", "<i8")], align=True)),
    "big-endian": lambda: np.arange(5, dtype=">i4"),
    "datetime": lambda: np.array(["2020-01-01", "2024-02-29"], dtype="datetime64[D]"),
    "complex": lambda: np.array([1 + 2j, 3 - 4j]),
    "bool": lambda: np.array([True, False, True]),
    "float16": lambda: np.arange(7, dtype=np.float16),
    "fortran": _fortran,
    "fortran shared": lambda: _fortran().view(SharedMemoryArray),
    "strided": lambda: np.arange(48.0).reshape(6, 8)[::2, 1:7],
    "transposed 3-d": lambda: np.arange(24).reshape(2, 3, 4).transpose(1, 0, 2),
    "read-only": _read_only,
    "empty": lambda: np.zeros((0, 3), np.float32),
    "empty shared": lambda: np.zeros((4, 0)).view(SharedMemoryArray),
    "size-1 dims": lambda: np.arange(3.0).reshape(3, 1),
}


@pytest.mark.parametrize("protocol", [5, pickle.DEFAULT_PROTOCOL])
@pytest.mark.parametrize("name", list(LEAVES))
def test_every_leaf_kind_arrives_as_its_pickle_would(name, protocol):
    leaf = LEAVES[name]()
    outputs = [leaf, {"x": leaf, "y": np.int64(1) * np.ones(2)}, (leaf, [leaf])]
    got, records = _through_frames(outputs, protocol=protocol)
    for (state, out), expected, i in zip(got, outputs, range(3)):
        assert state == {"next_index": i}
        _assert_same(out, _pickled(expected, protocol))
        if isinstance(leaf, np.ndarray) and out is not leaf:
            assert not np.shares_memory(np.asarray(out if i == 0 else out["x"] if i == 1 else out[0]), leaf)
    # None of them fell back to a pickle (but a non-native byte order, which
    # protocol 4 converts for some dtypes): each record names its layout.
    fallback = protocol < 5 and not leaf.dtype.isnative
    assert all((frames._LAYOUT_ID.unpack_from(r)[0] == frames.FALLBACK) == fallback for r in records)


def _object_array():
    a = np.empty(2, dtype=object)
    a[:] = [{"a": 1}, "b"]
    return a


FALLBACKS = {
    "object array": lambda: {"x": _object_array()},
    "python scalars": lambda: {"x": np.arange(3), "n": 3, "s": "text", "none": None},
    "numpy scalar": lambda: np.float32(2.5),
    "bytes leaf": lambda: b"raw",
    "dataclass with an attribute that is no field": lambda: Extra(np.arange(3)),
    "dict subclass": lambda: Keyed(a=np.arange(3)),
    "dtype with metadata": lambda: np.zeros(2, dtype=np.dtype(np.float32, metadata={"unit": "m"})),
    "ndarray subclass": lambda: np.ma.masked_array(np.arange(3), mask=[0, 1, 0]),
    "recarray": lambda: np.rec.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]),
    "no leaves": lambda: {"a": None, "b": ()},
    "None": lambda: None,
}


@pytest.mark.parametrize("protocol", [5, pickle.DEFAULT_PROTOCOL])
@pytest.mark.parametrize("name", list(FALLBACKS))
def test_what_frames_cannot_describe_exactly_travels_pickled(name, protocol):
    output = FALLBACKS[name]()
    got, records = _through_frames([output], protocol=protocol)
    assert frames._LAYOUT_ID.unpack_from(records[0])[0] == frames.FALLBACK
    _assert_same(got[0][1], _pickled(output, protocol))


TREES = {
    "dict": lambda: {"image": np.ones((2, 3), np.float32), "label": np.arange(2, dtype=np.int32)},
    "dict of shared": lambda: {
        "image": np.ones((2, 3), np.float32).view(SharedMemoryArray),
        "label": np.arange(2, dtype=np.int32).view(SharedMemoryArray),
    },
    "non-str keys": lambda: {1: np.arange(2), (2, "b"): np.arange(3)},
    "nested": lambda: {"a": {"b": [np.arange(2), (np.arange(3.0),)]}, "c": np.zeros(1)},
    "tuple": lambda: (np.arange(3), np.ones(2)),
    "list": lambda: [np.arange(3), [np.ones(2)]],
    "namedtuple": lambda: Point(np.arange(2), np.arange(3.0)),
    "typed namedtuple": lambda: Typed(np.zeros((2, 2)), np.arange(2)),
    "dataclass": lambda: Example(np.zeros((2, 2), np.uint8), np.arange(2)),
    "frozen dataclass with None": lambda: Frozen(np.arange(3)),
    "ordered dict": lambda: collections.OrderedDict([("z", np.arange(2)), ("a", np.ones(1))]),
    "defaultdict": lambda: collections.defaultdict(list, {"a": np.arange(2)}),
    "None inside": lambda: {"a": None, "b": np.arange(2), "c": (None, np.ones(1))},
    "empty containers": lambda: {"a": [], "b": {}, "c": np.arange(1)},
}


@pytest.mark.parametrize("name", list(TREES))
def test_trees_arrive_with_their_node_types(name):
    outputs = [TREES[name](), TREES[name]()]  # The second reuses the first's layout.
    got, records = _through_frames(outputs)
    for (_, out), expected in zip(got, outputs):
        _assert_same(out, _pickled(expected))
    if name == "defaultdict":
        assert got[0][1].default_factory is list
    # The layout is defined once: the second record carries no definition.
    first, second = (frames._RECORD.unpack_from(r) for r in records)
    assert first[0] == second[0] != frames.FALLBACK
    assert first[2] > 0 and second[2] == 0


def test_a_layout_change_mid_stream_delivers_each_output_as_it_was():
    base = {"image": np.ones((2, 2), np.float32), "label": np.arange(2)}
    outputs = [
        base,
        {"image": np.ones((3, 2), np.float32), "label": np.arange(3)},  # Other shapes: the same layout.
        {"label": np.arange(2), "image": np.ones((2, 2), np.float32)},  # Keys in another order.
        {"image": np.ones((2, 2), np.float64), "label": np.arange(2)},  # Another dtype.
        (base["image"], base["label"]),  # Another structure.
        {"image": np.ones((2, 2), np.float32).view(SharedMemoryArray), "label": np.arange(2)},  # Another type.
        {"image": np.asfortranarray(np.ones((2, 3), np.float32)), "label": np.arange(2)},  # Another order.
        {"image": np.ones((2, 2), np.float32), "label": 7},  # A leaf that is no array: pickled.
        base,  # Back to the first.
    ]
    for group in (False, True):
        got, records = _through_frames(outputs, group=group)
        for i, ((state, out), expected) in enumerate(zip(got, outputs)):
            assert state == {"next_index": i}
            _assert_same(out, _pickled(expected))
        ids = [frames._LAYOUT_ID.unpack_from(r)[0] for r in records]
        assert ids[0] == ids[1] == ids[8] and len(set(ids)) == 7 and ids[7] == frames.FALLBACK


def test_a_writer_defines_its_layouts_again_after_forgetting_what_it_announced():
    writer = frames.Writer()
    out = {"a": np.arange(3)}
    first = frames._RECORD.unpack_from(writer.record(0, out))
    assert frames._RECORD.unpack_from(writer.record(1, out))[2] == 0
    writer.forget_announced()  # A reset: the consumer dropped what was sent before it.
    again = frames._RECORD.unpack_from(writer.record(2, out))
    assert again[0] == first[0] and again[2] == first[2] > 0


def test_states_are_kept_opaque_and_unpickled_on_demand():
    states = [{"next_index": 5, "nested": [1, {"x": "y"}]}, None, ("tuple", 3)]
    got, _ = _through_frames([np.arange(2)] * 3, states=states, group=True)
    assert [s for s, _ in got] == states


def test_segment_leaves_are_views_of_the_segment_of_their_type_and_order():
    released = []
    reader = shm.SegmentReader(released.append)
    size = 1 << 16
    fd, region = new_segment(size)
    os.close(os.dup(fd))  # (The reader closes the descriptor it is given.)
    reader.add([(5, size)], [fd])
    raw = np.asarray(region)
    raw[:48] = np.arange(48, dtype=np.uint8)
    writer = frames.Writer()
    layouts: dict = {}
    cases = [
        (shm.ShmLeaf(5, (4, 3), "<f4", shm._PLAIN), np.ndarray, True),
        (shm.ShmLeaf(5, (3, 4), "<f4", shm._FORTRAN), np.ndarray, False),
        (shm.ShmLeaf(5, (12,), "<i4", shm._SHARED), SharedMemoryArray, True),
    ]
    for leaf, cls, c_order in cases:
        record = writer.record({"i": 1}, {"big": leaf, "small": np.arange(3)})
        buf = bytearray(frames.frame(frames.OUT_KIND, [record], [(5, size)]))
        kind, _, offsets, segments = frames.message(buf, layouts)
        assert kind == OUT and segments == [(5, size)]
        out = frames.output(buf, offsets[0], layouts, reader)
        big = out["big"]
        assert type(big) is cls and big.flags.c_contiguous == c_order and big.flags.writeable
        expected = raw[:48].view(leaf.dtype)
        assert big.tobytes(order="A") == expected.tobytes()
        before = raw[:48].copy()
        big.reshape(-1, order="A")[0] = 123  # The segment itself: the test's mapping of it sees the write.
        assert raw[:4].view(leaf.dtype)[0] == 123 and (raw[4:48] == before[4:]).all()
        raw[:48] = before
        view = big[1:]
        del out, big
        assert released == []  # A view keeps the segment.
        del view
        assert released == [5]
        released.clear()


def test_a_record_naming_a_segment_never_received_is_malformed():
    writer = frames.Writer()
    buf = bytearray(frames.frame(frames.OUT_KIND, [writer.record(0, shm.ShmLeaf(9, (2,), "<f4", 0))]))
    layouts: dict = {}
    _, _, offsets, _ = frames.message(buf, layouts)
    with pytest.raises(frames.Malformed, match="KeyError"):
        frames.output(buf, offsets[0], layouts, shm.SegmentReader(lambda i: None))


@pytest.mark.parametrize("cut", [14, 20, 29, 40, 60, 100, -1])
def test_truncated_frames_are_malformed_never_misread(cut):
    writer = frames.Writer()
    records = [writer.record({"i": i}, {"x": np.arange(4), "y": np.ones((2, 2))}) for i in range(2)]
    whole = frames.frame(frames.OUTS_KIND, records)
    buf = bytearray(whole[:cut])
    layouts: dict = {}
    with pytest.raises(frames.Malformed):
        _, _, offsets, _ = frames.message(buf, layouts)
        for pos in offsets:
            frames.output(buf, pos, layouts)


def test_a_frame_of_another_kind_or_an_undefined_layout_is_malformed():
    writer = frames.Writer()
    record = writer.record(0, np.arange(3))
    bad_kind = bytearray(frames.frame(b"Z", [record]))
    with pytest.raises(frames.Malformed, match="kind"):
        frames.message(bad_kind, {})
    writer.record(1, np.arange(3))  # Announced: the next record of it carries no definition.
    undefined = bytearray(frames.frame(frames.OUTS_KIND, [writer.record(2, np.arange(3))]))
    layouts: dict = {}
    _, _, offsets, _ = frames.message(undefined, layouts)
    with pytest.raises(frames.Malformed, match="never defined"):
        frames.output(undefined, offsets[0], layouts)


def test_a_pickled_message_is_unpickled_not_parsed():
    pickled = ForkingPickler.dumps(("end", {"i": 3}))
    for length in (struct.pack("!i", len(pickled)), struct.pack("!iQ", -1, len(pickled))):
        assert frames.message(bytearray(length + pickled), {}) == ("end", {"i": 3})


# -- through worker processes -------------------------------------------------------------


class Shapes:
    """Worker ``w``'s ``i``-th output changes its tree and leaves with ``i``; large ones go in shared memory."""

    def __init__(self, n):
        self.n = n

    @staticmethod
    def make(w, i):
        kind = i % 5
        x = np.full((i + 1, 2), w * 100 + i, np.float32)
        if kind == 0:
            return {"x": x, "label": np.array(i)}
        if kind == 1:
            return (x.view(SharedMemoryArray), [np.array(["a" * i])])
        if kind == 2:
            return Example(np.asfortranarray(np.ones((3, 2)) * i), np.arange(i))
        if kind == 3:
            return {"big": np.full((300, 300), i, np.float32), "obj": _object_array()}
        return {"big": np.full((200, 200), i, np.float64).view(SharedMemoryArray), "small": x}

    def outputs(self, worker_index, worker_count, state, alloc):
        for i in range(state, self.n):
            yield i + 1, self.make(worker_index, i)

    def end_state(self, worker_index, worker_count, state):
        return state

    def pickling_error(self, error):
        return error


def _as_delivered(output):
    """``output`` as it arrives from a worker: pickled as an ``OUT`` if a leaf is large (in shared memory), else as ``OUTS``."""
    large = isinstance(output, dict) and "big" in output
    return _pickled(output, pickle.DEFAULT_PROTOCOL if large else 5)


def _round_robin(states, next_worker, n):
    """``Shapes(n)``'s outputs in a pool's order from ``states``."""
    states, w = list(states), next_worker
    while any(s < n for s in states):
        if states[w] < n:
            yield Shapes.make(w, states[w])
            states[w] += 1
        w = (w + 1) % len(states)


def test_outputs_changing_layout_mid_stream_arrive_as_computed_and_survive_a_reset(no_leaks):
    n = 12
    with WorkerPool(Shapes(n), 2, [0, 0]) as pool:
        got = [next(pool) for _ in range(7)]
        assert pool.states == [4, 3] and pool.next_worker == 1
        # Workers go back (as set_state does) and define their layouts again.
        assert pool.reset([2, 1], 1, [False, False])
        again = list(pool)
    expected = list(_round_robin([0, 0], 0, n))[:7]
    for out, exp in zip(got, expected):
        _assert_same(out, _as_delivered(exp))
    expected = list(_round_robin([2, 1], 1, n))
    assert len(again) == len(expected)
    for out, exp in zip(again, expected):
        _assert_same(out, _as_delivered(exp))


def test_a_malformed_message_raises_an_error_naming_the_worker_and_ends_the_pool(no_leaks, monkeypatch):
    from grainlike.workers import receiving

    real = receiving.Stream.read
    calls = []

    def truncated(self, fd):
        raw = real(self, fd)
        calls.append(1)
        if raw is not None and len(calls) == 3 and raw[12:14] == b"GL":
            del raw[len(raw) // 2 :]
        return raw

    monkeypatch.setattr(receiving.Stream, "read", truncated)
    with WorkerPool(Shapes(40), 2, [0, 0]) as pool:
        with pytest.raises(RuntimeError, match=r"grainlike worker \d of 2 \(pid \d+\) sent a malformed output message"):
            for _ in range(80):
                next(pool)
        assert pool.broken
