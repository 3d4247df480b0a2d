"""Saves from several threads into one directory: each succeeds, a reader sees whole files.

Eight threads save eight different iterators' states through the handler into
one checkpoint directory, twenty times each, while other threads restore from
it. Each write goes to a temporary file of its own, renamed over
``process_0-of-1.json``: no save fails because another thread renamed or removed
its temporary file, and every restore reads the complete state of one of the
eight iterators.
"""

from __future__ import annotations

import threading

import pytest

import grainlike as grain

pytestmark = pytest.mark.timeout(120)

RECORDS = 64
THREADS = 8
SAVES = 20


def _loader() -> grain.DataLoader:
    return grain.DataLoader(
        data_source=grain.RangeDataSource(0, RECORDS, 1),
        sampler=grain.IndexSampler(RECORDS, grain.NoSharding(), shuffle=True, num_epochs=1, seed=3),
        operations=[grain.Batch(2)],
    )


def test_eight_threads_saving_into_one_directory_all_succeed_and_restores_read_whole_states(tmp_path):
    pytest.importorskip("orbax.checkpoint")
    handler = grain.checkpoint.CheckpointHandler()
    iterators = []
    for position in range(THREADS):
        it = iter(_loader())
        for _ in range(position + 1):
            next(it)
        iterators.append(it)
    states = {it.get_state() for it in iterators}
    assert len(states) == THREADS

    start = threading.Barrier(THREADS + 2)
    saving = threading.Event()
    errors: list[BaseException] = []
    restored: list[bytes] = []

    def save(it):
        try:
            start.wait()
            for _ in range(SAVES):
                handler.save(tmp_path, args=grain.checkpoint.CheckpointSave(it))
        except BaseException as e:  # pylint: disable=broad-except
            errors.append(e)

    def restore():
        try:
            start.wait()
            while saving.is_set():
                fresh = iter(_loader())
                handler.restore(tmp_path, args=grain.checkpoint.CheckpointRestore(fresh))
                restored.append(fresh.get_state())
        except BaseException as e:  # pylint: disable=broad-except
            errors.append(e)

    # A first file, so the readers never find the directory empty.
    handler.save(tmp_path, args=grain.checkpoint.CheckpointSave(iterators[0]))
    saving.set()
    savers = [threading.Thread(target=save, args=(it,)) for it in iterators]
    readers = [threading.Thread(target=restore) for _ in range(2)]
    for t in savers + readers:
        t.start()
    for t in savers:
        t.join()
    saving.clear()
    for t in readers:
        t.join()

    assert not errors, errors
    assert restored and set(restored) <= states
    # The last write left the file of one of the iterators, and nothing else.
    assert [p.name for p in tmp_path.iterdir()] == ["process_0-of-1.json"]
    assert (tmp_path / "process_0-of-1.json").read_bytes() in states
    for it in iterators:
        it.close()
