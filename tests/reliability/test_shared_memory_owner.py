"""Named shared-memory segments planted or changed by another user are never read, nor run.

``/dev/shm`` is shared by every user of the machine: another user (``nobody``,
through ``setpriv``) can create a segment under the name a job will attach to
with ``InMemoryDataSource(name=...)``. These tests plant such segments holding a
pickle that would create a marker file if it were ever unpickled, and check that
grainlike refuses them by owner before reading, that the marker never appears,
and that even a segment of this user's is read as JSON, never unpickled.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import secrets
import stat
import subprocess
import sys
from multiprocessing import shared_memory

import numpy as np
import pytest

from grainlike.core import named_segments
from grainlike.core.errors import UnsafeSegmentError
from grainlike.core.shared_memory_array import SharedMemoryArray, SharedMemoryArrayMetadata
from grainlike.sources.formats import in_memory_records
from grainlike.sources.in_memory import InMemoryDataSource

NOBODY = 65534
SHM = "/dev/shm"
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="planting a segment as another local user (setpriv --reuid) needs root"
)
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not os.path.isdir(SHM), reason="needs /dev/shm"),
]

Point = collections.namedtuple("Point", ["x", "y"])


class _RunsCommand:
    """Unpickling this runs a shell command: what a planted header would hold."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _payload(marker, magic: bytes = in_memory_records.PICKLED_HEADER_MAGIC) -> bytes:
    """A whole segment: grainlike's prefix, then a header that creates ``marker`` if unpickled."""
    header = pickle.dumps(_RunsCommand(f"touch {marker}"), protocol=2)
    body = in_memory_records.PREFIX.pack(magic, len(header)) + header
    return body + b"\0" * (in_memory_records.align(len(body)) + 64 - len(body))


@pytest.fixture
def segment_name():
    """A fresh segment name, removed after the test whoever created it."""
    name = f"gltest_owner_{os.getpid()}_{secrets.token_hex(4)}"
    yield name
    try:
        os.unlink(os.path.join(SHM, name))
    except FileNotFoundError:
        pass


def _plant_as_nobody(name: str, content: bytes, mode: int = 0o644) -> None:
    """Creates segment ``name`` as user nobody (a real POSIX shared-memory object) holding ``content``."""
    script = (
        "import _posixshmem, os, sys\n"
        "data = sys.stdin.buffer.read()\n"
        f"fd = _posixshmem.shm_open({'/' + name!r}, os.O_CREAT | os.O_EXCL | os.O_RDWR, {mode:#o})\n"
        f"os.fchmod(fd, {mode:#o})\n"
        "os.write(fd, data)\n"
        "os.close(fd)\n"
    )
    subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c", script],
        input=content, check=True, timeout=30, cwd="/",
    )
    st = os.stat(os.path.join(SHM, name))
    assert st.st_uid == NOBODY  # the attack is real: the segment is nobody's


def _plant_as_self(name: str, content: bytes, mode: int = 0o600) -> None:
    fd = os.open(os.path.join(SHM, name), os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, mode)
        os.write(fd, content)
    finally:
        os.close(fd)


@needs_root
@pytest.mark.parametrize("magic", [in_memory_records.PICKLED_HEADER_MAGIC, in_memory_records.MAGIC])
def test_a_segment_planted_by_another_user_is_refused_and_its_pickle_never_runs(segment_name, tmp_path, magic):
    marker = tmp_path / "planted-code-ran"
    _plant_as_nobody(segment_name, _payload(marker, magic))
    with pytest.raises(UnsafeSegmentError) as info:
        InMemoryDataSource(name=segment_name)
    message = str(info.value)
    assert repr(segment_name) in message
    assert "owned by uid 65534 (nobody)" in message and "refusing to read it" in message
    assert isinstance(info.value, PermissionError)
    assert not marker.exists()
    # The refused segment stays as it was (it is not ours to remove).
    assert os.stat(os.path.join(SHM, segment_name)).st_uid == NOBODY


@needs_root
def test_a_pickled_copy_of_a_named_source_refuses_a_segment_planted_after_the_owner_went(segment_name, tmp_path):
    """A worker's copy attaches by name on its first read: the name may by then be someone else's."""
    with InMemoryDataSource(np.arange(8), name=segment_name) as owner:
        copy = pickle.loads(pickle.dumps(owner))
    marker = tmp_path / "planted-code-ran"
    _plant_as_nobody(segment_name, _payload(marker, in_memory_records.MAGIC))
    with pytest.raises(UnsafeSegmentError, match="owned by uid 65534"):
        copy[0]
    with pytest.raises(UnsafeSegmentError, match="owned by uid 65534"):
        copy.unlink()  # nor is another user's segment removed
    assert os.path.exists(os.path.join(SHM, segment_name))
    assert not marker.exists()


@needs_root
def test_shared_memory_array_refuses_another_users_segment(segment_name):
    _plant_as_nobody(segment_name, np.arange(4, dtype=np.int64).tobytes())
    metadata = SharedMemoryArrayMetadata(name=segment_name, shape=(4,), dtype=np.int64)
    with pytest.raises(UnsafeSegmentError, match=f"{segment_name}.*owned by uid 65534"):
        SharedMemoryArray.from_metadata(metadata)


@pytest.mark.parametrize("mode", [0o666, 0o620, 0o602])
def test_an_own_segment_that_others_may_write_is_refused(segment_name, tmp_path, mode):
    marker = tmp_path / "planted-code-ran"
    _plant_as_self(segment_name, _payload(marker, in_memory_records.MAGIC), mode)
    with pytest.raises(UnsafeSegmentError, match=f"'{segment_name}'.*has mode {mode:04o}: group or others can write it"):
        InMemoryDataSource(name=segment_name)
    assert not marker.exists()


def test_an_own_segment_with_a_pickled_header_is_never_unpickled(segment_name, tmp_path):
    marker = tmp_path / "planted-code-ran"
    _plant_as_self(segment_name, _payload(marker, in_memory_records.MAGIC))
    with pytest.raises(ValueError, match=f"'{segment_name}' has a malformed header: the header is not JSON"):
        InMemoryDataSource(name=segment_name)
    assert not marker.exists()
    os.unlink(os.path.join(SHM, segment_name))
    _plant_as_self(segment_name, _payload(marker))  # an older grainlike's segment
    with pytest.raises(ValueError, match="older grainlike, whose pickled header is not read"):
        InMemoryDataSource(name=segment_name)
    assert not marker.exists()


def _segment_with_header(name: str, header: object, data: bytes = b"\0" * 256) -> None:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    body = in_memory_records.PREFIX.pack(in_memory_records.MAGIC, len(raw)) + raw
    _plant_as_self(name, body + b"\0" * (in_memory_records.align(len(body)) - len(body)) + data)


_GOOD = {"kind": "array", "len": 4, "treedef": ["leaf", 0], "leaves": [[0, [4], "<i8"]]}


@pytest.mark.parametrize(
    "header, message",
    [
        (dict(_GOOD, leaves=[[0, [4], "|O"]]), "holds Python objects"),
        (dict(_GOOD, leaves=[[0, [4], "not a dtype"]]), "is not a numpy dtype"),
        (dict(_GOOD, leaves=[[0, [4], {"descr": "<i8"}]]), "a dtype must be a numpy type string"),
        (dict(_GOOD, leaves=[[0, [10**6], "<i8"]]), "ends past the segment's data"),
        (dict(_GOOD, leaves=[[-64, [4], "<i8"]]), "offset must be an int"),
        (dict(_GOOD, leaves=[[0, [4, -1], "<i8"]]), "dimension must be an int"),
        (dict(_GOOD, len=5), "does not hold 5 records"),
        (dict(_GOOD, kind="pickle"), "kind must be one of"),
        (dict(_GOOD, treedef=["leaf", 3]), "a leaf index must be an int in"),
        (dict(_GOOD, kind="tree", treedef=["tuple", ["os", "system"], [["leaf", 0]]]), "os.system is not a tuple class"),
        (dict(_GOOD, kind="tree", treedef=["dict", None, [["s", "a"]], [["leaf", 0], ["leaf", 0]]]), "appears twice"),
        (dict(_GOOD, extra=1), "must be an object with kind, len, treedef and leaves"),
        (b"[" * 100_000 + b"]" * 100_000, "the header is not JSON: RecursionError"),
        (b"\x80\x04K\x01.", "the header is not JSON"),
    ],
)
def test_an_own_segment_with_a_malformed_header_is_a_clear_error(segment_name, header, message):
    _segment_with_header(segment_name, header)
    with pytest.raises(ValueError, match=f"'{segment_name}' has a malformed header: .*{message}"):
        InMemoryDataSource(name=segment_name)


def test_a_header_longer_than_its_segment_is_a_clear_error(segment_name):
    _plant_as_self(segment_name, in_memory_records.PREFIX.pack(in_memory_records.MAGIC, 1 << 40) + b"{}")
    with pytest.raises(ValueError, match="has a header of 1099511627776 bytes, longer than the segment"):
        InMemoryDataSource(name=segment_name)


def test_named_segments_are_created_0600_whatever_the_umask(segment_name):
    old = os.umask(0)
    try:
        with InMemoryDataSource([1, 2, 3], name=segment_name):
            st = os.stat(os.path.join(SHM, segment_name))
            assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    finally:
        os.umask(old)


def test_the_header_of_a_named_segment_is_json(segment_name):
    data = {"img": np.zeros((3, 2), np.uint8), "pt": Point(np.arange(3), np.arange(3.0))}
    with InMemoryDataSource(data, name=segment_name):
        with open(os.path.join(SHM, segment_name), "rb") as f:
            magic, size = in_memory_records.PREFIX.unpack(f.read(in_memory_records.PREFIX.size))
            header = json.loads(f.read(size))
    assert magic == in_memory_records.MAGIC
    assert header["kind"] == "tree" and header["len"] == 3
    assert header["treedef"][0] == "dict" and header["treedef"][1] is None
    assert header["treedef"][3][1][1] == [__name__, "Point"]
    assert [leaf[1:] for leaf in header["leaves"]] == [[[3, 2], "|u1"], [[3], "<i8"], [[3], "<f8"]]


@pytest.mark.parametrize(
    "make",
    [
        lambda: [1, "a", b"\x00", None, 2.5, True, 2**70],
        lambda: np.arange(12, dtype=">u4").reshape(6, 2),
        lambda: np.zeros(4, dtype=np.dtype([("a", "u1"), ("b", "<i4", (2,))], align=True)),
        lambda: collections.OrderedDict(b=np.arange(3), a=(np.ones(3), {"c": np.arange(3) * 2})),
        lambda: {1: np.arange(3), (2, "x"): np.arange(3), None: np.arange(3), b"k": np.arange(3), 1.5: np.arange(3)},
        lambda: (Point(np.arange(2), np.arange(2) + 1), np.arange(2)),
    ],
    ids=["scalars", "big-endian", "aligned-struct", "ordered-dict", "keys", "namedtuple"],
)
def test_attaching_by_name_reads_the_same_records_and_repr(segment_name, make):
    elements = make()
    with InMemoryDataSource(elements, name=segment_name) as owner:
        other = InMemoryDataSource(name=segment_name)
        try:
            assert len(other) == len(owner) and repr(other) == repr(owner)
            for i in range(len(owner)):
                a, b = owner[i], other[i]
                assert type(a) is type(b)
                assert repr(a) == repr(b)
        finally:
            other.close()


def test_a_structure_a_named_header_cannot_name_is_refused_when_created(segment_name):
    class Local(dict):
        pass

    with pytest.raises(TypeError, match="defined inside a function.*pass it without name="):
        InMemoryDataSource(Local(a=np.arange(2)), name=segment_name)
    with pytest.raises(TypeError, match="the key .* cannot be described in a named segment's header"):
        InMemoryDataSource({frozenset(): np.arange(2)}, name=segment_name)
    # Without a name the header is never read by another process: both work.
    with InMemoryDataSource(Local(a=np.arange(2))) as source:
        assert type(source[1]) is Local
    assert not os.path.exists(os.path.join(SHM, segment_name))


def test_unlinking_by_name_removes_only_own_segments(segment_name):
    with InMemoryDataSource([1], name=segment_name) as owner:
        copy = pickle.loads(pickle.dumps(owner))
        copy.unlink()
        assert not os.path.exists(os.path.join(SHM, segment_name))
    named_segments.unlink_untracked(segment_name)  # a name nobody has: nothing to do


def test_attaching_a_grain_shareable_list_by_name_is_a_clear_error(segment_name):
    shareable = shared_memory.ShareableList([1, 2], name=segment_name)
    try:
        with pytest.raises(ValueError, match="not created by InMemoryDataSource"):
            InMemoryDataSource(name=segment_name)
    finally:
        shareable.shm.close()
        shareable.shm.unlink()


def test_no_module_reading_shared_memory_unpickles():
    """The modules that read named segments hold no unpickling call at all."""
    import inspect

    from grainlike.core import shared_memory_array, shm_owner
    from grainlike.sources import in_memory
    from grainlike.sources.formats import in_memory_header

    for module in (in_memory, in_memory_header, in_memory_records, named_segments, shm_owner, shared_memory_array):
        source = inspect.getsource(module)
        for call in ("pickle.loads", "pickle.load(", "Unpickler", "allow_pickle=True", "marshal.loads"):
            assert call not in source, (module.__name__, call)
