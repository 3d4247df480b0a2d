"""The process files of one Orbax checkpoint must come from one save.

A 2-process job is simulated in this process: JAX process 0 of 2 saves through a
real ``CheckpointManager``, process 1 of 2 writes its file into the same step with
the handler, as the second host would. Copying process 1's file in from another
step is refused with the files named; untouched checkpoints restore as before.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import grainlike as grain
from grainlike.core import state_files
from grainlike.core.errors import InvalidStateError

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


def test_each_process_file_has_a_save_record_of_its_step(two_steps):
    item = two_steps / "1" / "data_iter"
    names = sorted(p.name for p in item.iterdir() if p.name.startswith("process_"))
    assert names == ["process_0-of-2.json", "process_0-of-2.save.json", "process_1-of-2.json", "process_1-of-2.save.json"]
    # Process 0's was written into Orbax's temporary step directory: the record
    # names the step all the same.
    assert '"save": "1"' in (item / "process_0-of-2.save.json").read_text()
    assert '"save": "1"' in (item / "process_1-of-2.save.json").read_text()


def test_files_of_one_save_restore_on_every_process(two_steps, monkeypatch):
    for index in range(2):
        full = _rest(iter(_loader(index, 2)))
        with _restore(two_steps / "2" / "data_iter", monkeypatch, index) as it:
            assert _rest(it) == full[4:]


def test_a_process_file_copied_in_with_its_record_from_a_later_step_is_refused_naming_both(two_steps, monkeypatch):
    old, new = two_steps / "1" / "data_iter", two_steps / "2" / "data_iter"
    for name in ("process_1-of-2.json", "process_1-of-2.save.json"):
        shutil.copy(new / name, old / name)
    # Each process compares its file with process 0's and the next one's.
    for index in range(2):
        with pytest.raises(InvalidStateError, match=r"process_0-of-2\.json from save '1'; process_1-of-2\.json from save '2'"):
            _restore(old, monkeypatch, index)


def test_process_0s_file_from_another_step_is_refused_by_every_process(two_steps, monkeypatch):
    old, new = two_steps / "1" / "data_iter", two_steps / "2" / "data_iter"
    for name in ("process_0-of-2.json", "process_0-of-2.save.json"):
        shutil.copy(new / name, old / name)
    for index in range(2):
        with pytest.raises(InvalidStateError, match=r"come from different saves"):
            _restore(old, monkeypatch, index)


def test_a_process_file_copied_in_alone_from_a_later_step_is_refused_naming_it(two_steps, monkeypatch):
    old, new = two_steps / "1" / "data_iter", two_steps / "2" / "data_iter"
    shutil.copy(new / "process_1-of-2.json", old / "process_1-of-2.json")
    it = iter(_loader(1, 2))
    before = next(it)
    with pytest.raises(InvalidStateError, match=r"process_1-of-2\.json is not the state file its save record process_1-of-2\.save\.json"):
        _as_process(monkeypatch, 1, 2)
        grain.checkpoint.CheckpointHandler().restore(old, args=grain.checkpoint.CheckpointRestore(it))
    # Refused before anything changed.
    assert _rest(it)[:2] == _rest(iter(_loader(1, 2)))[2:4]
    assert np.asarray(before).tolist() == _rest(iter(_loader(1, 2)))[:2]


def test_mixed_files_are_refused_when_restoring_onto_another_process_count(two_steps, monkeypatch):
    old, new = two_steps / "1" / "data_iter", two_steps / "2" / "data_iter"
    for name in ("process_1-of-2.json", "process_1-of-2.save.json"):
        shutil.copy(new / name, old / name)
    _as_process(monkeypatch, 0, 1)
    with pytest.raises(InvalidStateError, match=r"come from different saves"):
        grain.checkpoint.CheckpointHandler().restore(
            old, args=grain.checkpoint.CheckpointRestore(iter(_loader(0, 1)))
        )
    # Unmixed, the same step restores onto one process: every record once.
    _as_process(monkeypatch, 0, 1)
    it = iter(_loader(0, 1))
    grain.checkpoint.CheckpointHandler().restore(new, args=grain.checkpoint.CheckpointRestore(it))
    seen = _rest(iter(_loader(0, 2)))[:4] + _rest(iter(_loader(1, 2)))[:4]
    assert sorted(seen + _rest(it)) == list(range(RECORDS))
