"""User code that exits or forks: one clear error, no element lost or repeated, nothing left running.

``sys.exit()``, ``os._exit()`` and ``KeyboardInterrupt`` raised by a transform
name the transform and the element, and ``get_state()`` after the error points
at the failed element (never past it), so a restore retries it. Before:
``sys.exit()`` in a read thread surfaced as an internal ``IndexError: deque
index out of range`` with elements lost, and without threads ``get_state()``
went past elements never delivered.

A process a transform forks is a copy of the worker: it never delivers an
output (before, the DataLoader delivered 332 elements of a 300-record epoch),
and nothing it leaves outlives the job.
"""

from __future__ import annotations

import os

import pytest

import grainlike as grain
from grainlike.core.errors import WorkerDiedError
from grainlike.dataset import MapDataset
from grainlike.dataset.nodes.options import MultiprocessingOptions, ReadOptions
from tests.helpers import leaks
from tests.reliability.user_code import ExitAt, ForkAndWait, ForkAt, first

pytestmark = pytest.mark.timeout(180)

N = 40
HOWS = ["sys.exit", "os._exit", "KeyboardInterrupt"]


def _pipeline(face: str, transform, workers: int = 2, read_options=None):
    if face == "loader":
        return grain.DataLoader(
            data_source=grain.RangeDataSource(0, N, 1),
            sampler=grain.IndexSampler(N, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
            operations=[transform],
            worker_count=workers,
            read_options=read_options,
        )
    ds = MapDataset.range(N).map(transform).to_iter_dataset(read_options)
    return ds.mp_prefetch(MultiprocessingOptions(num_workers=workers)) if workers else ds


def _until(it, error_type, got: list):
    with pytest.raises(error_type) as info:
        while True:
            got.append(first(next(it)))
    return info.value


def _rest_from(face: str, state, workers: int = 2, read_options=None) -> list:
    fresh = iter(_pipeline(face, ExitAt("sys.exit", at=None), workers, read_options))
    try:
        fresh.set_state(state)
        return [first(x) for x in fresh]
    finally:
        fresh.close()


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("face", ["mp_prefetch", "loader"])
def test_a_worker_ended_by_the_users_code_is_one_clear_error_and_a_restore_retries_the_element(no_leaks, face, how):
    it = iter(_pipeline(face, ExitAt(how)))
    got: list = []
    error = _until(it, WorkerDiedError, got)
    message = str(error)
    # Which worker, where in the user's code, how.
    assert "grainlike worker 1 of 2 (pid " in message  # element 13 is worker 1's
    assert "ExitAt.map" in message and "user_code.py" in message
    if how == "sys.exit":
        assert "exit code 3" in message and "sys.exit(3)" in message
    elif how == "os._exit":
        assert "exit code 4" in message and "os._exit(4)" in message
    else:
        assert "KeyboardInterrupt was raised" in message
    if how != "os._exit":
        # The element, named by the stage that ran the transform (os._exit leaves no exception to note).
        where = "on the record at global index 13" if face == "loader" else "on the element at index 13"
        assert where in message
    if face == "mp_prefetch":
        # The iteration cannot silently go on without the worker's elements.
        with pytest.raises(WorkerDiedError, match="cannot go on"):
            next(it)
        assert it.get_state()["exhausted"] == [0, 0]
    state = it.get_state()
    it.close()
    # Nothing lost, nothing repeated: the restore starts at the failed element.
    assert 13 not in got
    assert got + _rest_from(face, state) == list(range(N))


@pytest.mark.parametrize("how", ["sys.exit", "KeyboardInterrupt"])
@pytest.mark.parametrize(
    "read_options", [ReadOptions(num_threads=4, prefetch_buffer_size=16), ReadOptions(num_threads=0)],
    ids=["read_threads", "calling_thread"],
)
@pytest.mark.parametrize("face", ["dataset", "loader"])
def test_without_workers_the_exit_reaches_the_caller_and_the_state_points_at_the_failed_element(
    no_leaks, face, read_options, how
):
    # As grain (a read thread's exception is re-raised by the caller): the same
    # type, with a note naming the transform and the element.
    it = iter(_pipeline(face, ExitAt(how), workers=0, read_options=read_options))
    got: list = []
    error = _until(it, SystemExit if how == "sys.exit" else KeyboardInterrupt, got)
    notes = " ".join(getattr(error, "__notes__", []))
    assert "ExitAt" in notes
    assert ("on the record at global index 13" if face == "loader" else "on the element at index 13") in notes
    state = it.get_state()
    if face == "dataset":
        # Never past an element not delivered: the failed one, or the first of its read.
        assert state["next_index"] == len(got) <= 13
    it.close()
    assert got + _rest_from(face, state, workers=0, read_options=read_options) == list(range(N))


@pytest.mark.parametrize("child", ["carry_on", "linger"])
@pytest.mark.parametrize("face", ["loader", "mp_prefetch"])
def test_a_process_forked_by_a_transform_delivers_nothing_and_outlives_nothing(no_leaks, tmp_path, face, child):
    pid_file = tmp_path / "children"
    n = 300
    transform = ForkAt(50, child, str(pid_file))
    if face == "loader":
        pipeline = grain.DataLoader(
            data_source=grain.RangeDataSource(0, n, 1),
            sampler=grain.IndexSampler(n, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
            operations=[transform],
            worker_count=2,
        )
    else:
        ds = MapDataset.range(n).map(transform).to_iter_dataset()
        pipeline = ds.mp_prefetch(MultiprocessingOptions(num_workers=2))
    it = iter(pipeline)
    got = [first(x) for x in it]
    it.close()
    # Every element exactly once: the copy delivered nothing.
    assert got == list(range(n))
    children = [int(line) for line in pid_file.read_text().split()]
    assert children and all(pid != os.getpid() for pid in children)
    # The copy went when the worker did.
    assert leaks.wait_until(lambda: all(leaks.process_ended(pid) for pid in children), timeout=10)


def test_processes_a_transform_forks_and_ends_itself_work_as_without_workers(no_leaks):
    # A child (and its own child) that do their work and end with os._exit()
    # are left alone: the guard acts only on a copy that goes on as the worker.
    ds = MapDataset.range(12).map(ForkAndWait()).to_iter_dataset()
    it = iter(ds.mp_prefetch(MultiprocessingOptions(num_workers=2)))
    try:
        assert list(it) == list(range(12))
    finally:
        it.close()
