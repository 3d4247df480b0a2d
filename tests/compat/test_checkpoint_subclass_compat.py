"""Subclasses of the Orbax handler that override ``save``/``restore`` run as in grain.

MaxText subclasses ``PyGrainCheckpointHandler`` and overrides ``save()`` and
``restore()`` to write one ``process_{i}.json`` per iterator of a list. Orbax
must call those overrides with grainlike's handler as it does with grain's, with
asynchronous checkpointing on and off. The subclass below is written that way
(for each library's base class) and runs through a real ``CheckpointManager``.
"""

from __future__ import annotations

import json

import orbax.checkpoint as ocp
import pytest

import grainlike
from grainlike import checkpoint as gckpt

pytestmark = pytest.mark.timeout(120)

STEP = 3
TAKEN = 5  # elements taken from each iterator before the save
SHARDS = 2


def _subclass(base, dataset_iterator_cls):
    """A MaxText-style handler subclass over ``base``, recording which methods ran."""

    class ListOfIteratorsHandler(base):
        calls: list[str] = []

        def save(self, directory, item=None, args=None):
            type(self).calls.append("save")
            item = item or args.item
            for index, iterator in enumerate(item):
                assert isinstance(iterator, dataset_iterator_cls)
                (directory / f"process_{index}.json").write_text(
                    json.dumps(iterator.get_state(), indent=4)
                )

        def restore(self, directory, item=None, args=None):
            type(self).calls.append("restore")
            item = item or args.item
            for index, iterator in enumerate(item):
                filename = directory / f"process_{index}.json"
                if not filename.exists():
                    raise ValueError(f"File {filename} does not exist.")
                iterator.set_state(json.loads(filename.read_text()))
            return item

    return ListOfIteratorsHandler


def _library(lib_name, grain_ref):
    if lib_name == "grainlike":
        return grainlike, gckpt.PyGrainCheckpointHandler, gckpt.PyGrainCheckpointSave, gckpt.PyGrainCheckpointRestore
    del grain_ref  # loaded (absl flags parsed) by the fixture
    import grain

    return (grain, grain.checkpoint.CheckpointHandler, grain.checkpoint.CheckpointSave,
            grain.checkpoint.CheckpointRestore)


def _iterators(lib):
    return [
        iter(lib.MapDataset.range(40)[shard::SHARDS].shuffle(seed=7).map(lambda x: x * 10)
             .to_iter_dataset())
        for shard in range(SHARDS)
    ]


def _manager(path, handler, save_args, restore_args, async_on):
    # As MaxText-style code does: the subclass handles the library's own args.
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    registry.add("data_iter", save_args, handler)
    registry.add("data_iter", restore_args, handler)
    return ocp.CheckpointManager(
        path,
        handler_registry=registry,
        options=ocp.CheckpointManagerOptions(enable_async_checkpointing=async_on),
    )


def _save_and_restore(lib_name, grain_ref, path, async_on):
    lib, base, save_args, restore_args = _library(lib_name, grain_ref)
    handler_cls = _subclass(base, lib.DatasetIterator)
    handler_cls.calls = []
    iterators = _iterators(lib)
    for it in iterators:
        for _ in range(TAKEN):
            next(it)
    with _manager(path, handler_cls(), save_args, restore_args, async_on) as mngr:
        mngr.save(STEP, args=ocp.args.Composite(data_iter=save_args(iterators)))
        mngr.wait_until_finished()
    expected = [[next(it) for _ in range(6)] for it in iterators]
    files = {p.name: p.read_text() for p in (path / str(STEP) / "data_iter").glob("process_*")}

    fresh = _iterators(lib)
    with _manager(path, handler_cls(), save_args, restore_args, async_on) as mngr:
        restored = mngr.restore(STEP, args=ocp.args.Composite(data_iter=restore_args(fresh)))
    got = [[next(it) for _ in range(6)] for it in restored.data_iter]
    return handler_cls.calls, files, expected, got


@pytest.mark.parametrize("async_on", [True, False], ids=["async", "sync"])
def test_subclass_save_and_restore_overrides_run_through_the_checkpoint_manager(
    grain_ref, tmp_path, async_on
):
    calls, files, expected, got = _save_and_restore("grainlike", grain_ref, tmp_path / "gl", async_on)
    ref_calls, ref_files, ref_expected, ref_got = _save_and_restore(
        "grain", grain_ref, tmp_path / "g", async_on
    )
    assert ref_calls == ["save", "restore"]  # how grain's handler is called
    assert calls == ref_calls
    assert sorted(files) == sorted(ref_files) == ["process_0.json", "process_1.json"]
    assert files == ref_files
    assert got == expected == ref_expected == ref_got


def test_unsubclassed_handler_still_saves_in_the_background(tmp_path):
    # The override check must leave grainlike's own handler asynchronous: its
    # async_save returns a commit future instead of writing the file itself.
    import asyncio

    it = iter(grainlike.MapDataset.range(5).to_iter_dataset())
    next(it)
    directory = tmp_path / "item"
    directory.mkdir()
    futures = asyncio.run(
        gckpt.PyGrainCheckpointHandler().async_save(directory, args=gckpt.PyGrainCheckpointSave(it))
    )
    assert len(futures) == 1
    futures[0].result()
    assert json.loads((directory / "process_0-of-1.json").read_text()) == it.get_state()
