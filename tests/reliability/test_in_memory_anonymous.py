"""InMemoryDataSource in anonymous memory: shared with workers by descriptor, gone with its processes.

A source created without ``name=`` lives in a sealed memfd segment: its workers
map the very pages of the owner (checked by inode), nothing of it appears in
``/dev/shm``, a SIGKILL of the whole process group leaves nothing behind, and
holding its records costs no descriptors.
"""

import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

import grainlike as grain
from grainlike.workers.start import pickle_task
from grainlike.sources.in_memory import InMemoryDataSource
from tests.helpers import leaks
from tests.helpers.processes import in_session

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(90)


def source_inodes(pid="self") -> set:
    """Inodes of the anonymous source segments that process ``pid`` maps.

    Sources are mapped read-only (``r--s``), batches and the progress page
    read-write; without memfd_create the segments' names do not tell them apart.
    """
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {
                int(fields[4]) for line in f
                if leaks.is_anonymous_segment(line.rstrip("\n")) and (fields := line.split())[1] == "r--s"
            }
    except OSError:
        return set()


def held_inodes(pid) -> set:
    """Inodes of the anonymous segments that process ``pid`` holds a descriptor of."""
    out = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for name in names:
        try:
            if leaks.is_anonymous_segment(os.readlink(f"/proc/{pid}/fd/{name}")):
                out.add(os.stat(f"/proc/{pid}/fd/{name}").st_ino)
        except OSError:
            pass
    return out


def inode(source) -> int:
    return os.fstat(source._fd).st_ino


def descendants() -> list:
    """Pids of this process's descendants (the forkserver and the workers it forked)."""
    return [p.pid for p in psutil.Process().children(recursive=True)]


def mapping_workers(source, count) -> list:
    """The descendants that map ``source``'s memory, once ``count`` of them do."""
    node = inode(source)
    found = []

    def enough():
        found[:] = [pid for pid in descendants() if node in source_inodes(pid)]
        return len(found) >= count

    assert leaks.wait_until(enough, 20), (node, {pid: source_inodes(pid) for pid in descendants()})
    return found


def sampler(n, epochs=1, seed=0):
    return grain.IndexSampler(n, grain.NoSharding(), shuffle=True, num_epochs=epochs, seed=seed)


def records_of(data, n):
    """The same records as a plain list (a source that involves no shared memory)."""
    return [{k: v[i] for k, v in data.items()} for i in range(n)]


DATA = {"x": np.arange(40 * 3, dtype=np.float32).reshape(40, 3), "y": np.arange(40) * 7}


def _loader(source, workers):
    return grain.DataLoader(
        data_source=source, sampler=sampler(40, epochs=2, seed=5), operations=[grain.Batch(4)],
        worker_count=workers,
    )


def _dataset(source, workers):
    ds = grain.MapDataset.source(source).shuffle(seed=5).to_iter_dataset().batch(4)
    return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers)) if workers else ds


def _dataset_after_init(source, workers):
    # With a worker_init_fn the worker unpickles the pipeline only after it ran,
    # after the task itself was loaded. (max: a picklable function of two ints.)
    ds = grain.MapDataset.source(source).shuffle(seed=5).to_iter_dataset().batch(4)
    return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers), worker_init_fn=max) if workers else ds


def _assert_same_batches(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert set(a) == set(b)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
            assert a[k].dtype == b[k].dtype


@pytest.mark.parametrize("build", [_loader, _dataset], ids=["DataLoader", "mp_prefetch"])
@pytest.mark.parametrize("workers", [0, 2])
def test_outputs_equal_those_of_a_plain_list_source(no_leaks, build, workers):
    want = list(build(records_of(DATA, 40), workers))
    with InMemoryDataSource(DATA) as source:
        got = list(build(source, workers))
    _assert_same_batches(got, want)


@pytest.mark.parametrize(
    "build", [_loader, _dataset, _dataset_after_init], ids=["DataLoader", "mp_prefetch", "worker_init_fn"]
)
def test_workers_map_the_owners_memory_not_a_copy(no_leaks, build):
    with InMemoryDataSource(DATA) as source:
        it = iter(build(source, 2))
        try:
            next(it)
            # The source is unpickled (and mapped) as each worker loads its pipeline:
            # the same inode as the owner's, so the same pages, not a copy.
            workers = mapping_workers(source, 2)
            assert all(source_inodes(w) == {inode(source)} for w in workers)
        finally:
            it.close()


def test_a_worker_shipment_carries_a_descriptor_not_the_data():
    big = np.ones((1024, 1024), np.float64)  # 8 MiB
    with InMemoryDataSource(big) as a, InMemoryDataSource([1, "two", None]) as b:
        task = {"sources": [a, b, a], "ops": (lambda x: x,)}
        payload, shipped = pickle_task(_Task(task))
        try:
            assert len(payload) < 64 * 1024
            assert sorted(os.fstat(fd).st_ino for fd in shipped.values()) == sorted([inode(a), inode(b)])
        finally:
            for fd in shipped.values():
                os.close(fd)
        # Unpickled in the owner's own process, the copy maps the owner's memory.
        import cloudpickle

        copy = cloudpickle.loads(payload).payload["sources"]
        assert copy[0] is copy[2] and copy[0][5].sum() == 1024 and copy[1][1] == "two"
        assert np.shares_memory(copy[0][5], a[5])


class _Task:
    """A stand-in for a worker task: what ``pickle_task`` needs."""

    def __init__(self, payload):
        self.payload = payload

    def pickling_error(self, error):
        return error


def test_a_shipment_for_workers_cannot_be_loaded_once_its_owner_is_closed():
    import cloudpickle

    source = InMemoryDataSource(np.arange(10))
    payload, shipped = pickle_task(_Task(source))
    for fd in shipped.values():
        os.close(fd)
    source.close()
    with pytest.raises(ValueError, match="sent to the worker processes of a loader"):
        cloudpickle.loads(payload)


def test_memory_is_released_when_the_last_reference_goes(no_leaks):
    source = InMemoryDataSource(DATA)
    node = inode(source)
    loader = _loader(source, 2)
    with iter(loader) as it:
        batches = list(it)
    assert len(batches) == 20
    record = source[3]
    source.close()
    family = descendants() + [os.getpid()]
    # Workers gone, the owner's descriptor closed; the forkserver kept no copy.
    assert all(node not in held_inodes(pid) for pid in family)
    assert all(node not in source_inodes(pid) for pid in family if pid != os.getpid())
    assert node in source_inodes()  # still mapped: the record refers to it
    np.testing.assert_array_equal(record["x"], DATA["x"][3])
    del record
    assert node not in source_inodes()


def _fd_count(pid="self"):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_holding_records_and_batches_costs_no_descriptors(no_leaks):
    data = {"x": np.zeros((600, 64 * 1024), np.uint8), "y": np.arange(600)}  # batches of 128 KiB and more
    with InMemoryDataSource(data) as source:
        first = _fd_count()
        held = [source[i] for i in range(600)]
        assert _fd_count() == first
        loader = grain.DataLoader(
            data_source=source, sampler=sampler(600), operations=[grain.Batch(2)], worker_count=2,
        )
        with iter(loader) as it:
            held += [next(it) for _ in range(10)]
            consumer = _fd_count()
            workers = mapping_workers(source, 2)
            counts = [_fd_count(w) for w in workers]
            held += list(it)  # 290 more batches, every one held
            assert _fd_count() <= consumer + 2
            assert all(_fd_count(w) <= c + 2 for w, c in zip(workers, counts))
    assert len(held) == 600 + 300
    del held


def test_another_jobs_segments_are_never_touched(no_leaks):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ns = os.stat("/proc/self/ns/pid").st_ino
    # Names of the kind an owner-sweep would once have removed, and another job's name.
    names = [f"grainlike_src_{dead.pid}_{ns}_123_aaaa0001", f"gltest_{os.getpid()}_other_job"]
    for name in names:
        with open(os.path.join("/dev/shm", name), "wb") as f:
            f.write(b"x")
    try:
        with InMemoryDataSource(DATA) as source:
            list(_loader(source, 2))
        assert all(os.path.exists(os.path.join("/dev/shm", n)) for n in names)
    finally:
        for name in names:
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except FileNotFoundError:
                pass


_GROUP = """
import os, sys, time
sys.path.insert(0, {root!r})
import numpy as np
import grainlike as grain

# 80 MiB: more than Docker's default /dev/shm of 64 MiB.
source = grain.InMemoryDataSource({{"x": np.ones((80, 1 << 20), np.uint8), "y": np.arange(80)}})
loader = grain.DataLoader(
    data_source=source,
    sampler=grain.IndexSampler(80, grain.NoSharding(), shuffle=True, num_epochs=None, seed=0),
    operations=[grain.Batch(2)], worker_count=2, worker_buffer_size=2)
it = iter(loader)
held = [next(it) for _ in range(4)]
print("ready", int(sum(int(b["x"].sum()) for b in held)), os.fstat(source._fd).st_ino, flush=True)
time.sleep(60)
"""


def _with_private_dev_shm(tmp_path, argv):
    """``(argv run with an empty directory of its own as /dev/shm, that directory)``.

    The directory shows exactly what the processes left in /dev/shm, whatever
    other jobs on the machine do there meanwhile. Where no mount namespace can
    be made, ``(argv, None)``.
    """
    if shutil.which("unshare") is None:
        return argv, None
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        return argv, None
    shm_dir = tmp_path / "dev_shm"
    shm_dir.mkdir()
    command = " ".join(shlex.quote(a) for a in argv)
    return ["unshare", "-m", "sh", "-c", f"mount --bind {shlex.quote(str(shm_dir))} /dev/shm && exec {command}"], shm_dir


def _lasting_names(directory) -> list:
    """The names in ``directory`` now that are still there 0.2 s later."""
    names = set(os.listdir(directory))
    if names:
        time.sleep(0.2)
        names &= set(os.listdir(directory))
    return sorted(names)


def test_a_killed_process_group_leaves_no_source_memory_behind(no_leaks, tmp_path):
    script = tmp_path / "group.py"
    script.write_text(textwrap.dedent(_GROUP.format(root=ROOT)))
    argv, shm_dir = _with_private_dev_shm(tmp_path, [sys.executable, str(script)])
    with in_session(argv) as proc:
        line = proc.stdout.readline().split()
        assert line and line[0] == "ready", proc.stderr.read()
        total, node = (int(x) for x in line[1:])
        assert total == 8 << 20  # 4 batches of 2 records of 1 MiB of ones
        group = leaks.session_processes(proc.pid)
        mapping = [pid for pid in group if node in source_inodes(pid)]
        assert proc.pid in mapping and len(mapping) >= 3  # the owner and both workers
        for pid in group:
            try:
                with open(f"/proc/{pid}/maps") as f:
                    # Nothing with a name in /dev/shm (without memfd_create,
                    # segments there are unlinked as soon as they are opened).
                    named = [m for m in f.read().splitlines() if "/dev/shm/" in m and not m.endswith("(deleted)")]
                assert named == []
            except FileNotFoundError:
                pass  # a process of the group that ended meanwhile
        if shm_dir is not None:
            # A name lives from its shm_open to its shm_unlink, microseconds, in a
            # worker making a segment right now: only one still there later is left.
            assert _lasting_names(shm_dir) == []
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert leaks.wait_until(lambda: not leaks.session_processes(proc.pid), 10)
        if shm_dir is not None:
            assert os.listdir(shm_dir) == []
