"""The iterator's Orbax item is written in the background of an asynchronous save.

The file write is made observable by holding it at a gate (a patched write
function standing in for a slow filesystem): ``CheckpointManager.save()`` must
return while the write is held, with the state of the iterator at ``save()``,
and the file written afterwards must be the bytes grain 0.2.18's handler writes.
"""

from __future__ import annotations

import threading
import time

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

import grainlike
from grainlike import checkpoint as gckpt
from grainlike.core import state_files
from grainlike.jax.device_iterator import DeviceIterator
from tests.helpers.pipelines import build, take

pytestmark = pytest.mark.timeout(120)

N = 40
K = 3  # batches delivered before the save
STATE_FILE = "process_0-of-1.json"
PARAMS = {"w": jnp.arange(8.0), "b": jnp.float32(1.5)}
# Long enough that save() returning before the gate opens is not luck of timing.
GATE_TIMEOUT_S = 20


def _loader(lib, worker_count=0):
    return build(lib, list(range(N)), num_records=N, shuffle=True, seed=3,
                 ops=["map", "rand", "batch"], batch_size=4, worker_count=worker_count)


def _async_manager(path, **options):
    return ocp.CheckpointManager(
        path, options=ocp.CheckpointManagerOptions(enable_async_checkpointing=True, **options)
    )


def _save_args(it):
    return ocp.args.Composite(model=ocp.args.StandardSave(PARAMS), data=gckpt.CheckpointSave(it))


def _restore_args(it):
    return ocp.args.Composite(
        model=ocp.args.StandardRestore(PARAMS), data=gckpt.CheckpointRestore(it)
    )


def _state_files(path):
    return sorted(path.rglob(STATE_FILE))


class Gate:
    """Holds grainlike's checkpoint file writes until ``open()``."""

    def __init__(self, monkeypatch):
        self.opened = threading.Event()
        self.writes_waiting = threading.Event()
        self.released = threading.Event()
        self.writer_threads = []
        write = state_files._write_file

        def held_write(filename, text):
            self.writer_threads.append(threading.current_thread())
            self.writes_waiting.set()
            # Opens by itself after a while, so a save() that waits for the write
            # fails the test instead of hanging it.
            self.opened.wait(GATE_TIMEOUT_S)
            self.released.set()
            write(filename, text)

        monkeypatch.setattr(state_files, "_write_file", held_write)

    def open(self):
        self.opened.set()


@pytest.mark.parametrize("worker_count", [0, 2])
def test_save_returns_before_the_state_file_is_written(tmp_path, monkeypatch, worker_count, no_leaks):
    gate = Gate(monkeypatch)
    with _async_manager(tmp_path) as mngr, iter(_loader(grainlike, worker_count)) as it:
        take(it, K)
        state_at_save = it.get_state()
        mngr.save(K, args=_save_args(it))
        # save() is back while the write is still held.
        assert not gate.released.is_set()
        assert gate.writes_waiting.wait(GATE_TIMEOUT_S), "the write never started"
        assert all(t is not threading.main_thread() for t in gate.writer_threads)
        assert _state_files(tmp_path) == []
        # The loop goes on; the checkpoint keeps the position at save().
        take(it, 2)
        assert it.get_state() != state_at_save
        gate.open()
        mngr.wait_until_finished()
        assert mngr.latest_step() == K
    assert _state_files(tmp_path) == [tmp_path / str(K) / "data" / STATE_FILE]
    assert _state_files(tmp_path)[0].read_bytes() == state_at_save


def test_file_written_in_the_background_is_grains_bytes(grain_ref, tmp_path, monkeypatch):
    gate = Gate(monkeypatch)
    with _async_manager(tmp_path / "grainlike") as mngr, iter(_loader(grainlike)) as it:
        take(it, K)
        mngr.save(K, args=_save_args(it))
        assert not gate.released.is_set()
        take(it, 2)
        gate.open()
        mngr.wait_until_finished()
    # grain's handler, writing the same position of the same pipeline.
    grain_it = iter(_loader(grain_ref))
    take(grain_it, K)
    with ocp.CheckpointManager(tmp_path / "grain") as mngr:
        mngr.save(K, args=ocp.args.Composite(
            model=ocp.args.StandardSave(PARAMS), data=grain_ref.PyGrainCheckpointSave(grain_it)))
        mngr.wait_until_finished()
    rel = f"{K}/data/{STATE_FILE}"
    assert (tmp_path / "grainlike" / rel).read_bytes() == (tmp_path / "grain" / rel).read_bytes()

    # And grain's handler restores it.
    expected = take(grain_it, 100)
    fresh = iter(_loader(grain_ref))
    with ocp.CheckpointManager(tmp_path / "grainlike") as mngr:
        mngr.restore(K, args=ocp.args.Composite(
            model=ocp.args.StandardRestore(PARAMS), data=grain_ref.PyGrainCheckpointRestore(fresh)))
    assert take(fresh, 100) == expected


@pytest.mark.parametrize("worker_count", [0, 2])
def test_device_iterator_saves_the_batches_delivered_not_prefetched(tmp_path, monkeypatch, worker_count):
    with iter(_loader(grainlike, worker_count)) as ref:
        expected = take(ref, 100)
    gate = Gate(monkeypatch)
    with _async_manager(tmp_path) as mngr, DeviceIterator(
        iter(_loader(grainlike, worker_count)), prefetch=3
    ) as it:
        take(it, K)
        time.sleep(0.2)  # lets the prefetch thread run ahead
        mngr.save(K, args=_save_args(it))
        assert not gate.released.is_set() and _state_files(tmp_path) == []
        take(it, 2)
        gate.open()
        mngr.wait_until_finished()
    with _async_manager(tmp_path) as mngr, iter(_loader(grainlike, worker_count)) as fresh:
        mngr.restore(K, args=_restore_args(fresh))
        assert take(fresh, 100) == expected[K:]


def test_restore_waits_for_the_write_in_flight(tmp_path, monkeypatch):
    with iter(_loader(grainlike)) as ref:
        expected = take(ref, 100)
    gate = Gate(monkeypatch)
    with _async_manager(tmp_path) as mngr, iter(_loader(grainlike)) as it, iter(
        _loader(grainlike)
    ) as fresh:
        take(it, K)
        mngr.save(K, args=_save_args(it))
        opener = threading.Timer(0.5, gate.open)
        opener.start()
        try:
            mngr.restore(K, args=_restore_args(fresh))  # no wait_until_finished() first
            assert gate.opened.is_set()
        finally:
            opener.cancel()
            gate.open()
        assert take(fresh, 100) == expected[K:]


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    with iter(_loader(grainlike)) as ref:
        expected = take(ref, 100)
    write = state_files._write_file
    failing = threading.Event()

    def write_or_fail(filename, text):
        if failing.is_set():
            raise OSError(28, "No space left on device", str(filename))
        write(filename, text)

    monkeypatch.setattr(state_files, "_write_file", write_or_fail)
    with _async_manager(tmp_path) as mngr, iter(_loader(grainlike)) as it:
        take(it, 2)
        mngr.save(2, args=_save_args(it))
        mngr.wait_until_finished()
        take(it, 2)
        failing.set()
        mngr.save(4, args=_save_args(it))
        with pytest.raises(OSError, match="No space left on device"):
            mngr.wait_until_finished()
        assert mngr.all_steps() == [2]
    with _async_manager(tmp_path) as mngr, iter(_loader(grainlike)) as fresh:
        assert mngr.latest_step() == 2
        mngr.restore(2, args=_restore_args(fresh))
        assert take(fresh, 100) == expected[2:]


def test_no_write_thread_outlives_the_manager(tmp_path, monkeypatch):
    gate = Gate(monkeypatch)
    with iter(_loader(grainlike)) as it:
        with _async_manager(tmp_path) as mngr:
            next(it)
            mngr.save(1, args=_save_args(it))
            assert gate.writes_waiting.wait(GATE_TIMEOUT_S)
            threading.Timer(0.3, gate.open).start()
        # Closing waited for the write, and nothing it started is left.
        assert (tmp_path / "1" / "data" / STATE_FILE).read_bytes() == it.get_state()
        assert not [t for t in gate.writer_threads if t.is_alive() and t.name.startswith("grainlike")]
        assert not [t.name for t in threading.enumerate() if t.name == "grainlike_iterator_state"]
