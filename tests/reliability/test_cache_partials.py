"""Copies into the local cache of remote files killed halfway: their partial files are counted, then removed.

A real job (a child process) copies an object through ``LocalCache`` from a store
whose ranged reads past the middle wait for a file to appear (a slow network);
the test kills it there with SIGKILL or SIGTERM, then runs new jobs (new processes)
against the same cache directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest

from grainlike.sources.formats import file_cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCK = 64 << 10
BIG = 16 * BLOCK  # the object killed halfway
HALF = 8 * BLOCK  # reads of blocks from here on wait for the gate
SMALL = 2 * BLOCK
TIMEOUT = 60

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(sys.platform != "linux", reason="flock, SIGKILL and st_blocks as on Linux")]

# One job: fetches ``url`` into the cache and prints the local path. Its store is
# an fsspec memory filesystem of its own ("gated://"), filled with the same
# bytes in every job; reads from HALF on wait for ``<gate>/go`` when a gate is given.
_JOB = r"""
import os, sys, time, zlib
sys.path.insert(0, sys.argv[1])
import numpy as np
import fsspec
from fsspec.implementations.memory import MemoryFileSystem

cache_dir, url, size, max_bytes, gate = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
HALF = int(sys.argv[7])


class GatedMemory(MemoryFileSystem):
    protocol = "gated"
    store = {}
    pseudo_dirs = [""]

    def cat_file(self, path, start=None, end=None, **kwargs):
        data = super().cat_file(path, start=start, end=end, **kwargs)
        if gate != "-" and (start or 0) >= HALF:
            while not os.path.exists(os.path.join(gate, "go")):
                time.sleep(0.02)
        return data


fsspec.register_implementation("gated", GatedMemory, clobber=True)
fs = fsspec.filesystem("gated")
fs.pipe_file("/" + url.split("://", 1)[1], np.random.default_rng(zlib.crc32(url.encode())).bytes(size))

from grainlike.sources.formats import file_cache, remote_files as remote

options = remote.RemoteOptions(block_size=int(sys.argv[8]), attempts=1)
cache = file_cache.LocalCache(cache_dir, options, max_bytes=None if max_bytes == "-" else int(max_bytes))
print(cache.fetch(url), flush=True)
"""


def _contents(url: str, size: int) -> bytes:
    return np.random.default_rng(zlib.crc32(url.encode())).bytes(size)


def _argv(cache, url, size, max_bytes=None, gate=None) -> list:
    return [
        sys.executable, "-c", _JOB, ROOT, str(cache), url, str(size),
        "-" if max_bytes is None else str(max_bytes), "-" if gate is None else str(gate), str(HALF), str(BLOCK),
    ]


def _run_job(cache, url, size, max_bytes=None) -> str:
    """A whole job, to its end: the local path of ``url``'s copy."""
    done = subprocess.run(_argv(cache, url, size, max_bytes), capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def _partials(cache) -> list:
    return sorted(n for n in os.listdir(cache) if n.startswith(".partial-"))


def _written(path) -> int:
    st = os.stat(path)
    return min(st.st_size, st.st_blocks * 512)


def _wait_until(predicate, what: str, child=None) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        if child is not None and child.poll() is not None:
            raise AssertionError(f"the copying job ended ({child.returncode}) before {what}: {child.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.02)


class _CopyingJob:
    """A job copying ``url`` (BIG bytes), held at HALF until ``release()``; killed at exit if still running."""

    def __init__(self, cache, url, gate):
        self.cache, self.url, self.gate = cache, url, gate
        self.proc = subprocess.Popen(
            _argv(cache, url, BIG, gate=gate), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
        )

    def __enter__(self) -> "_CopyingJob":
        def halfway() -> bool:
            return os.path.isdir(self.cache) and any(
                _written(os.path.join(self.cache, n)) >= HALF for n in _partials(self.cache)
            )

        _wait_until(halfway, "its copy was halfway written", self.proc)
        return self

    def release(self) -> None:
        (self.gate / "go").touch()

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=TIMEOUT)


def _backdate(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


@pytest.fixture
def dirs(tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    return tmp_path / "cache", gate


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_copy_killed_midway_is_counted_against_the_bound_then_removed_by_the_next_job(dirs, sig):
    cache, gate = dirs
    old = _run_job(cache, "gated://bucket/old.bin", SMALL)
    _backdate(old, 3600)  # the least recently used copy
    with _CopyingJob(cache, "gated://bucket/big.bin", gate) as job:
        os.kill(job.proc.pid, sig)
        assert job.proc.wait(timeout=TIMEOUT) == -sig
    (partial,) = _partials(cache)
    assert f"-{job.proc.pid}-" in partial and _written(cache / partial) >= HALF

    # The next job, at once: the partial file is young, so it stays, but it takes
    # the disk and counts: a bound with room for two small copies, not for the
    # partial file too, evicts the old copy.
    bound = 2 * SMALL + SMALL // 2
    new = _run_job(cache, "gated://bucket/new.bin", SMALL, max_bytes=bound)
    assert _partials(cache) == [partial]
    assert not os.path.exists(old) and os.path.exists(new)

    # A job once the partial file has gone unwritten past PARTIAL_IDLE_S: its lock
    # is free (the copy is dead), so it is removed.
    _backdate(cache / partial, file_cache.PARTIAL_IDLE_S + 60)
    assert _run_job(cache, "gated://bucket/new.bin", SMALL, max_bytes=bound) == new
    assert _partials(cache) == []
    with open(new, "rb") as f:
        assert f.read() == _contents("gated://bucket/new.bin", SMALL)

    # And the object killed halfway is copied whole by the next job that reads it.
    path = _run_job(cache, "gated://bucket/big.bin", BIG)
    with open(path, "rb") as f:
        assert f.read() == _contents("gated://bucket/big.bin", BIG)
    assert _partials(cache) == []


def test_a_partial_file_a_live_copy_is_writing_is_never_removed(dirs):
    cache, gate = dirs
    with _CopyingJob(cache, "gated://bucket/big.bin", gate) as job:
        (partial,) = _partials(cache)
        # Idle for long (the copy waits on the network), but its copy holds the lock.
        _backdate(cache / partial, file_cache.PARTIAL_IDLE_S + 60)
        _run_job(cache, "gated://bucket/new.bin", SMALL, max_bytes=SMALL)  # a sweep and an eviction
        assert _partials(cache) == [partial]
        job.release()
        out, err = job.proc.communicate(timeout=TIMEOUT)
        assert job.proc.returncode == 0, err[-3000:]
    with open(out.strip(), "rb") as f:
        assert f.read() == _contents("gated://bucket/big.bin", BIG)
    assert _partials(cache) == []


def _plant(cache, name: str, size: int, uid=None) -> None:
    path = cache / name
    path.write_bytes(b"\1" * size)
    if uid is not None:
        os.chown(path, uid, uid)
    _backdate(path, file_cache.PARTIAL_IDLE_S + 60)


@pytest.mark.skipif(os.geteuid() != 0, reason="a file of another user's in the cache needs root (chown)")
def test_partial_files_of_another_user_or_of_another_form_are_left_alone(dirs):
    cache, _ = dirs
    _run_job(cache, "gated://bucket/new.bin", SMALL)
    name = "0123456789abcdef0123-x.bin"
    _plant(cache, f".partial-{name}-4242-deadbeef", BLOCK)  # ours, idle, lock free: removed
    _plant(cache, f".partial-meta-{name}-4242-deadbeef", 100)  # its sidecar's: removed
    _plant(cache, f".partial-{name}-4343-deadbeef", BLOCK, uid=65534)  # another user's
    _plant(cache, ".partial-notes.txt", BLOCK)  # not a copy's
    _run_job(cache, "gated://bucket/new.bin", SMALL)
    assert _partials(cache) == [f".partial-{name}-4343-deadbeef", ".partial-notes.txt"]
