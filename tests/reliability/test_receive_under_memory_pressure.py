"""The consumer under memory pressure: a failed receive loses nothing and ends no worker.

Receiving a worker's output takes steps in the consumer: reading the
message's bytes, parsing them, mapping the shared-memory segments its
arrays live in. Any of them can fail for want of memory. Before, such an error
stopped every worker, and ``mp_prefetch``'s restarted workers (forked from the
constrained consumer) failed in turn and were marked exhausted: the epoch
stopped at 112 of 200 and no restore could bring the rest back. Now an error
after the bytes were read keeps the message half received and the next
``next()`` receives the same output; an error while reading the bytes restarts
the workers from the last delivered outputs; no worker counts as ended either way.
"""

from __future__ import annotations

import errno
import json
import os
import sys

import pytest

import grainlike as grain
from grainlike.dataset import MapDataset
from grainlike.dataset.nodes.options import MultiprocessingOptions
from grainlike.workers import frames, receiving, shm
from grainlike.workers.messages import END, ERR
from tests.helpers.processes import run_in_session
from tests.reliability.user_code import Rows, RowsRaisingAt, first

pytestmark = pytest.mark.timeout(180)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = 60


def _pipeline(face: str):
    if face == "loader":
        return grain.DataLoader(
            data_source=grain.RangeDataSource(0, N, 1),
            sampler=grain.IndexSampler(N, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
            operations=[Rows()],
            worker_count=2,
        )
    ds = MapDataset.range(N).map(Rows()).to_iter_dataset()
    return ds.mp_prefetch(MultiprocessingOptions(num_workers=2))


class _FailOnce:
    """Wraps ``fn`` so that its ``at``-th call raises ``error`` instead (counting from 1)."""

    def __init__(self, fn, at: int, error: BaseException):
        self.fn, self.at, self.error, self.calls = fn, at, error, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.at:
            raise self.error
        return self.fn(*args, **kwargs)


def _inject(monkeypatch, where: str) -> None:
    if where == "mapping":  # The segments' mmap refused (what RLIMIT_AS does).
        real_add = shm.SegmentReader.add

        def refused(self, segments, fds):
            for fd in fds:  # As add() does whatever happens.
                os.close(fd)
            raise OSError(errno.ENOMEM, "cannot map a shared-memory segment")

        calls = []

        def add(self, segments, fds):
            calls.append(1)
            return (refused if len(calls) == 3 else real_add)(self, segments, fds)

        monkeypatch.setattr(shm.SegmentReader, "add", add)
    elif where == "parsing":
        monkeypatch.setattr(frames, "message", _FailOnce(frames.message, 7, MemoryError()))
    else:  # Reading the message's bytes: the stream's position is then unknown.
        read = _FailOnce(receiving.Stream.read, 7, MemoryError())
        monkeypatch.setattr(receiving.Stream, "read", lambda self, fd: read(self, fd))


@pytest.mark.parametrize("where", ["mapping", "parsing", "reading"])
@pytest.mark.parametrize("face", ["mp_prefetch", "loader"])
def test_an_error_receiving_an_output_is_raised_once_and_the_epoch_goes_on_exactly_once(
    no_leaks, monkeypatch, face, where
):
    _inject(monkeypatch, where)
    it = iter(_pipeline(face))
    got, errors = [], []
    while True:
        before = it.get_state()
        try:
            got.append(first(next(it)))
        except StopIteration:
            break
        except (MemoryError, OSError) as e:
            errors.append(e)
            # Nothing was delivered: the state is where it was, and no worker counts as ended.
            assert it.get_state() == before
            if face == "mp_prefetch":
                assert it.get_state()["exhausted"] == [0, 0]
    it.close()
    assert len(errors) == 1
    if where != "reading":
        assert "the next next() receives the same output again" in str(errors[0].__notes__)
    assert got == list(range(N))


class _FailAfter:
    """Wraps ``frames.message`` so that its first call after one that parsed a message of ``kind`` raises ``error``."""

    def __init__(self, fn, kind: str, error: BaseException):
        self.fn, self.kind, self.error, self.armed, self.raised = fn, kind, error, False, 0

    def __call__(self, *args, **kwargs):
        if self.armed:
            self.armed = False
            self.raised += 1
            raise self.error
        msg = self.fn(*args, **kwargs)
        if msg[0] == self.kind and not self.raised:
            self.armed = True
        return msg


@pytest.mark.parametrize("face", ["mp_prefetch", "loader"])
def test_an_error_receiving_a_message_after_a_worker_ended_keeps_that_end(no_leaks, monkeypatch, face):
    # Worker 0's end is taken in, then worker 1's end fails to parse in the same
    # next(): the position goes back to before both, and worker 0's end, read
    # off its socket already, is taken in again by the next next() (it used to
    # wait for another message from worker 0 for ever).
    fail = _FailAfter(frames.message, END, MemoryError())
    monkeypatch.setattr(frames, "message", fail)
    it = iter(_pipeline(face))
    got, errors = [], []
    while True:
        before = it.get_state()
        try:
            got.append(first(next(it)))
        except StopIteration:
            break
        except MemoryError as e:
            errors.append(e)
            assert it.get_state() == before
    it.close()
    assert fail.raised == 1
    assert len(errors) == 1
    assert got == list(range(N))


def test_an_error_receiving_a_message_after_a_worker_error_keeps_that_worker_ended(no_leaks, monkeypatch):
    # Worker 0's error was raised; the next next() counts worker 0 as ended, then
    # worker 1's message fails to parse: worker 0 still counts as ended after its
    # error (it used to be read again, stopped, and reported dead).
    fail = _FailAfter(frames.message, ERR, MemoryError())
    monkeypatch.setattr(frames, "message", fail)
    ds = MapDataset.range(N).map(RowsRaisingAt(0)).to_iter_dataset()
    it = iter(ds.mp_prefetch(MultiprocessingOptions(num_workers=2)))
    got, errors = [], []
    while True:
        before = it.get_state()
        try:
            got.append(first(next(it)))
        except StopIteration:
            break
        except (MemoryError, ValueError) as e:
            errors.append(type(e))
            if isinstance(e, MemoryError):
                assert it.get_state() == before
    it.close()
    assert fail.raised == 1
    assert errors == [ValueError, MemoryError]
    assert got == list(range(1, N, 2))


# The consumer under a real RLIMIT_AS: it holds every 8 MiB output it gets until
# mapping the next one's segment fails (three times), then the limit is lifted
# and the same iterator goes on.
_CONSTRAINED = r"""
import errno, json, resource, sys
import numpy as np
import psutil
import grainlike as grain
from grainlike.dataset import MapDataset


class Big(grain.MapTransform):
    def map(self, x):
        return np.full((1024, 2048), int(x), np.float32)  # 8 MiB


face, N = sys.argv[1], 200
if face == "loader":
    pipeline = grain.DataLoader(
        data_source=grain.RangeDataSource(0, N, 1),
        sampler=grain.IndexSampler(N, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
        operations=[Big()], worker_count=2,
    )
else:
    pipeline = MapDataset.range(N).map(Big()).to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=2))
it = iter(pipeline)
got = [int(next(it).ravel()[0])]
workers = sorted(it._pool.pids) if face != "loader" else None
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
resource.setrlimit(resource.RLIMIT_AS, (psutil.Process().memory_info().vms + (96 << 20), hard))
held, errors = [], []
while len(errors) < 3:
    try:
        x = next(it)
    except StopIteration:
        break
    except (MemoryError, OSError) as e:
        if isinstance(e, OSError) and e.errno != errno.ENOMEM:
            raise
        errors.append([type(e).__name__, it.get_state()["exhausted"] if face != "loader" else None])
        continue
    got.append(int(x.ravel()[0]))
    held.append(x)
resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
del held, x
got += [int(x.ravel()[0]) for x in it]
print("RESULT", json.dumps({
    "got": got, "errors": errors,
    "same_workers": face == "loader" or sorted(it._pool.pids if it._pool else []) in ([], workers),
}), flush=True)
"""


@pytest.mark.parametrize("face", ["mp_prefetch", "loader"])
def test_a_consumer_out_of_address_space_gets_every_output_once_the_memory_is_back(face):
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    proc, out, err = run_in_session([sys.executable, "-c", _CONSTRAINED, face], timeout=150, env=env, cwd=ROOT)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads([line for line in out.splitlines() if line.startswith("RESULT ")][-1][len("RESULT "):])
    assert len(result["errors"]) == 3, result["errors"]
    if face == "mp_prefetch":
        assert all(exhausted == [0, 0] for _, exhausted in result["errors"])
    assert result["same_workers"]  # received again, not restarted
    assert result["got"] == list(range(200))
