"""A checkpoint directory of grainlike's is grain 0.2.18's, file for file.

For every way grain checkpoints an iterator (Orbax v0's handler called through
``ocp.Checkpointer``, with grain.python's ``PyGrainCheckpoint*`` names and
grain.checkpoint's; ``ocp.CheckpointManager`` with ``ocp.args.Composite``; Orbax
v1 checkpointables; and the handler of each process of a multi-process job), the
same pipeline (a DataLoader with 0 and 2 workers, a Dataset iterator, an
``ElasticIterator``'s iterator) is run in grain and in grainlike and
checkpointed into two directories, and the whole trees are compared: the same
relative file names, and the same bytes in every file (``process_*-of-*.json``
included) except where Orbax writes what differs from run to run (see
``_comparable``). Then each library restores the other's directory and continues
with exactly what the writer's own run yields.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import sys
import types
from typing import Any, Callable

import orbax.checkpoint as ocp
import pytest

import grainlike
from grainlike.core import state_files
from tests.helpers.pipelines import build, take

pytestmark = pytest.mark.timeout(180)

K = 3  # elements taken before the checkpoint
STEP = 7  # the CheckpointManager's step


@dataclasses.dataclass(frozen=True)
class Side:
    """One library's names: ``lib`` as grain.python (or grainlike), and its namespaces."""

    name: str
    lib: types.ModuleType
    checkpoint: types.ModuleType
    experimental: types.ModuleType


@pytest.fixture(scope="module")
def sides(grain_ref) -> dict[str, Side]:
    import grain.checkpoint
    import grain.experimental

    return {
        "grain": Side("grain", grain_ref, grain.checkpoint, grain.experimental),
        "grainlike": Side("grainlike", grainlike, grainlike.checkpoint, grainlike.experimental),
    }


# --- The pipelines ----------------------------------------------------------------


def _dataloader(worker_count: int, shard: tuple[int, int] = (0, 1)) -> Callable[[Side], Any]:
    def make(side: Side) -> Any:
        return iter(build(side.lib, list(range(37)), num_records=37, num_epochs=2, shuffle=True, seed=5,
                          shard=(*shard, False), ops=["map", "rand", "batch"], batch_size=3,
                          worker_count=worker_count))

    return make


def _dataset(side: Side) -> Any:
    return iter(side.lib.MapDataset.range(23).shuffle(seed=5).map(lambda x: x * 3).to_iter_dataset().batch(4))


def _elastic(side: Side) -> Any:
    # What grain checkpoints of an ElasticIterator is its iterator (a
    # DatasetIterator); grain's handler cannot save the ElasticIterator itself
    # (it decodes the dict get_state() returns), and Orbax v1 takes only
    # iterators.
    ds = side.lib.MapDataset.range(40).map(lambda x: x + 100)
    return iter(side.experimental.ElasticIterator(ds, global_batch_size=4, shard_options=side.lib.ShardOptions(0, 2)))


PIPELINES = {
    "dataloader_w0": _dataloader(0),
    "dataloader_w2": _dataloader(2),
    "dataset": _dataset,
    "elastic": _elastic,
}


# --- The ways of checkpointing --------------------------------------------------


def _checkpointer_save(names: str):
    def save(side: Side, it: Any, path: pathlib.Path) -> None:
        handler, args = _handler_and_args(side, names, "Save")
        ocp.Checkpointer(handler()).save(path / "ckpt", args=args(it))

    return save


def _checkpointer_restore(names: str):
    def restore(side: Side, it: Any, path: pathlib.Path) -> None:
        handler, args = _handler_and_args(side, names, "Restore")
        assert ocp.Checkpointer(handler()).restore(path / "ckpt", args=args(it)) is it

    return restore


def _handler_and_args(side: Side, names: str, kind: str) -> tuple[type, type]:
    if names == "grain.python":
        return side.lib.PyGrainCheckpointHandler, getattr(side.lib, f"PyGrainCheckpoint{kind}")
    return side.checkpoint.CheckpointHandler, getattr(side.checkpoint, f"Checkpoint{kind}")


def _manager_save(side: Side, it: Any, path: pathlib.Path) -> None:
    with ocp.CheckpointManager(path) as mngr:
        mngr.save(STEP, args=ocp.args.Composite(data_iter=side.lib.PyGrainCheckpointSave(it)))
        mngr.wait_until_finished()


def _manager_restore(side: Side, it: Any, path: pathlib.Path) -> None:
    with ocp.CheckpointManager(path) as mngr:
        restored = mngr.restore(STEP, args=ocp.args.Composite(data_iter=side.lib.PyGrainCheckpointRestore(it)))
    assert restored.data_iter is it


def _v1():
    return pytest.importorskip("orbax.checkpoint.experimental.v1")


def _v1_save(side: Side, it: Any, path: pathlib.Path) -> None:
    del side
    _v1().save_checkpointables(path / "ckpt", {"data_iter": it})


def _v1_restore(side: Side, it: Any, path: pathlib.Path) -> None:
    del side
    _v1().load_checkpointables(path / "ckpt", {"data_iter": it})


WAYS = {
    "checkpointer_grain_python_names": (_checkpointer_save("grain.python"), _checkpointer_restore("grain.python")),
    "checkpointer_grain_checkpoint_names": (
        _checkpointer_save("grain.checkpoint"), _checkpointer_restore("grain.checkpoint")
    ),
    "checkpoint_manager": (_manager_save, _manager_restore),
    "orbax_v1": (_v1_save, _v1_restore),
}

CASES = [
    ("dataloader_w0", "checkpointer_grain_python_names"),
    ("dataloader_w0", "checkpointer_grain_checkpoint_names"),
    ("dataloader_w0", "checkpoint_manager"),
    ("dataloader_w2", "checkpoint_manager"),
    ("dataloader_w0", "orbax_v1"),
    ("dataset", "checkpointer_grain_python_names"),
    ("dataset", "checkpointer_grain_checkpoint_names"),
    ("dataset", "checkpoint_manager"),
    ("dataset", "orbax_v1"),
    ("elastic", "checkpointer_grain_checkpoint_names"),
    ("elastic", "checkpoint_manager"),
    ("elastic", "orbax_v1"),
]


# --- The comparison --------------------------------------------------------------

# Orbax's own files hold what differs between any two saves, of one library too:
# _CHECKPOINT_METADATA the times of the save (init_/commit_timestamp_nsecs) and
# the typestr of each item's handler class (grain's handler is
# grain._src.python.checkpoint.handler.CheckpointHandler, grainlike's
# grainlike.checkpoint.PyGrainCheckpointHandler: Orbax registers handlers by
# typestr, and one process holds both libraries' here); commit_success.txt the
# directory it was written to. Those values are replaced by placeholders; every
# key, every other value, and every other file's bytes are compared as written.
_TIME_KEYS = ("init_timestamp_nsecs", "commit_timestamp_nsecs")


def _comparable(side: Side, root: pathlib.Path, path: pathlib.Path) -> Any:
    data = path.read_bytes()
    if path.name == "_CHECKPOINT_METADATA":
        meta = json.loads(data)
        for key in _TIME_KEYS:
            assert isinstance(meta.pop(key), int), (path, key)
            meta[key] = "<time>"
        typestr = side.checkpoint.CheckpointHandler.typestr()
        handlers = meta["item_handlers"]
        if isinstance(handlers, dict):
            meta["item_handlers"] = {k: "<iterator handler>" if v == typestr else v for k, v in handlers.items()}
        elif handlers == typestr:
            meta["item_handlers"] = "<iterator handler>"
        return meta
    if path.name == "commit_success.txt":
        return data.decode().replace(str(root), "<root>")
    return data


def _tree(side: Side, root: pathlib.Path) -> dict[str, Any]:
    files = sorted(p for p in root.rglob("*") if not p.is_dir())
    return {str(p.relative_to(root)): _comparable(side, root, p) for p in files}


def _close(it: Any) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()


@pytest.mark.parametrize("pipeline,way", CASES, ids=[f"{p}-{w}" for p, w in CASES])
def test_checkpoint_directory_is_grains_and_restores_across(sides, tmp_path, pipeline, way):
    make, (save, restore) = PIPELINES[pipeline], WAYS[way]
    rest = {}
    for side in sides.values():
        it = make(side)
        take(it, K)
        save(side, it, tmp_path / side.name)
        rest[side.name] = take(it, 1000)
        _close(it)
    assert rest["grain"] == rest["grainlike"]  # the same pipeline

    trees = {name: _tree(side, tmp_path / name) for name, side in sides.items()}
    assert sorted(trees["grainlike"]) == sorted(trees["grain"])
    assert trees["grainlike"] == trees["grain"]
    # What MaxText checks: one state file per process.
    assert len(list((tmp_path / "grainlike").rglob("process_*-of-*.json"))) == 1

    for reader, writer in (("grainlike", "grain"), ("grain", "grainlike")):
        it = make(sides[reader])
        restore(sides[reader], it, tmp_path / writer)
        assert take(it, 1000) == rest[writer]
        _close(it)


# --- Several processes ------------------------------------------------------------


def _as_process(monkeypatch, index: int, count: int) -> None:
    # Both handlers ask for the process index and count in one place each.
    monkeypatch.setattr(sys.modules["grain._src.core.sharding"], "get_process_index_and_count", lambda: (index, count))
    monkeypatch.setattr(state_files, "_process_index_and_count", lambda: (index, count))


@pytest.mark.parametrize("pipeline", ["dataloader", "dataset"])
def test_each_process_of_a_job_writes_grains_file_and_nothing_else(sides, tmp_path, monkeypatch, pipeline):
    # Process i of 2 saves its own (sharded) iterator into the step's directory
    # with the handler, as each host of a job does.
    def make(side: Side, index: int) -> Any:
        if pipeline == "dataloader":
            return _dataloader(0, (index, 2))(side)
        return iter(side.lib.MapDataset.range(30).shuffle(seed=1)[index::2].to_iter_dataset().batch(2))

    rest = {}
    for side in sides.values():
        (tmp_path / side.name).mkdir()  # Orbax creates it before the handler runs.
        for index in range(2):
            _as_process(monkeypatch, index, 2)
            it = make(side, index)
            take(it, K + index)
            side.checkpoint.CheckpointHandler().save(tmp_path / side.name, args=side.checkpoint.CheckpointSave(it))
            rest[side.name, index] = take(it, 1000)
            _close(it)
    trees = {name: _tree(side, tmp_path / name) for name, side in sides.items()}
    assert sorted(trees["grainlike"]) == ["process_0-of-2.json", "process_1-of-2.json"]
    assert trees["grainlike"] == trees["grain"]

    for reader, writer in (("grainlike", "grain"), ("grain", "grainlike")):
        for index in range(2):
            _as_process(monkeypatch, index, 2)
            it = make(sides[reader], index)
            sides[reader].checkpoint.CheckpointHandler().restore(
                tmp_path / writer, args=sides[reader].checkpoint.CheckpointRestore(it)
            )
            assert take(it, 1000) == rest[writer, index]
            _close(it)


def test_the_time_fields_left_out_are_orbax_s_own(sides, tmp_path):
    # The placeholders stand for fields that differ between two saves of one
    # library, written by Orbax: two grainlike saves of one state differ there only.
    it = _dataset(sides["grainlike"])
    take(it, K)
    for name in ("a", "b"):
        _checkpointer_save("grain.checkpoint")(sides["grainlike"], it, tmp_path / name)
    raw = {name: json.loads((tmp_path / name / "ckpt" / "_CHECKPOINT_METADATA").read_text()) for name in ("a", "b")}
    differing = {k for k in raw["a"] if raw["a"][k] != raw["b"][k]}
    assert differing <= set(_TIME_KEYS)
    text = (tmp_path / "a" / "ckpt" / "commit_success.txt").read_text()
    assert re.fullmatch(r"Checkpoint commit was successful to .*/a/ckpt", text)
