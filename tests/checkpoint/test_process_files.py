"""The process files of an Orbax checkpoint: grain's ``process_{i}-of-{n}.json``, nothing else.

A 2-process job is simulated in this process: JAX process 0 of 2 saves through a
real ``CheckpointManager``, process 1 of 2 writes its file into the same step with
the handler, as the second host would. Each process restores its own file, on
the same number of processes or another.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import grainlike as grain
from grainlike.core import state_files

pytestmark = pytest.mark.timeout(60)

RECORDS = 40


def _loader(index: int, count: int) -> grain.DataLoader:
    return grain.DataLoader(
        data_source=grain.RangeDataSource(0, RECORDS, 1),
        sampler=grain.IndexSampler(RECORDS, grain.ShardOptions(index, count), shuffle=True, num_epochs=1, seed=5),
        operations=[grain.Batch(2)],
    )


def _as_process(monkeypatch, index, count):
    monkeypatch.setattr(state_files, "_process_index_and_count", lambda: (index, count))


@pytest.fixture
def two_steps(tmp_path, monkeypatch):
    """Steps 1 and 2 of a 2-process job; each process took ``step`` batches by then."""
    ocp = pytest.importorskip("orbax.checkpoint")
    its = [iter(_loader(i, 2)) for i in range(2)]
    with ocp.CheckpointManager(tmp_path) as mngr:
        for step in (1, 2):
            for it in its:
                next(it)
            _as_process(monkeypatch, 0, 2)
            mngr.save(step, args=ocp.args.Composite(data_iter=grain.checkpoint.CheckpointSave(its[0])))
            mngr.wait_until_finished()
            _as_process(monkeypatch, 1, 2)
            grain.checkpoint.CheckpointHandler().save(
                tmp_path / str(step) / "data_iter", args=grain.checkpoint.CheckpointSave(its[1])
            )
    for it in its:
        it.close()
    return tmp_path


def _restore(directory, monkeypatch, index):
    _as_process(monkeypatch, index, 2)
    it = iter(_loader(index, 2))
    grain.checkpoint.CheckpointHandler().restore(directory, args=grain.checkpoint.CheckpointRestore(it))
    return it


def _rest(it):
    return [int(v) for b in it for v in np.asarray(b)]


def test_each_process_writes_only_its_state_file(two_steps):
    # Tools list the directory as grain writes it: MaxText infers the process
    # count from the number of process_*-of-*.json files.
    item = two_steps / "1" / "data_iter"
    names = sorted(p.name for p in item.iterdir() if p.name != "commit_success.txt")
    assert names == ["process_0-of-2.json", "process_1-of-2.json"]
    assert len(list(item.glob("process_*-of-*.json"))) == 2


def test_files_of_one_save_restore_on_every_process(two_steps, monkeypatch):
    for index in range(2):
        full = _rest(iter(_loader(index, 2)))
        with _restore(two_steps / "2" / "data_iter", monkeypatch, index) as it:
            assert _rest(it) == full[4:]


def test_each_process_restores_the_state_in_its_own_file(two_steps, monkeypatch):
    # As in grain, a process reads its own file only: a file copied in from
    # another step restores that step's position for that process.
    old, new = two_steps / "1" / "data_iter", two_steps / "2" / "data_iter"
    shutil.copy(new / "process_1-of-2.json", old / "process_1-of-2.json")
    for index, taken in ((0, 2), (1, 4)):
        with _restore(old, monkeypatch, index) as it:
            assert _rest(it) == _rest(iter(_loader(index, 2)))[taken:]


def test_files_of_one_step_restore_onto_one_process_every_record_once(two_steps, monkeypatch):
    _as_process(monkeypatch, 0, 1)
    it = iter(_loader(0, 1))
    grain.checkpoint.CheckpointHandler().restore(
        two_steps / "2" / "data_iter", args=grain.checkpoint.CheckpointRestore(it)
    )
    seen = _rest(iter(_loader(0, 2)))[:4] + _rest(iter(_loader(1, 2)))[:4]
    assert sorted(seen + _rest(it)) == list(range(RECORDS))
