"""Orbax checkpointing of grainlike iterators: real CheckpointManagers on tmp_path."""

from __future__ import annotations

import functools
import json
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

import grainlike as grain
from grainlike import checkpoint as gckpt
from grainlike.jax.device_iterator import DeviceIterator

pytestmark = pytest.mark.timeout(60)

WORKERS = [0, 2]
ROOT = pathlib.Path(__file__).resolve().parents[1]


def make_loader(worker_count=0, num_records=48, seed=7):
    # Defined in here so cloudpickle ships it by value: a worker would otherwise
    # import this module, and with it jax and orbax.
    class Square(grain.MapTransform):
        def map(self, x):
            return {"id": np.int64(x), "x2": np.int64(x) * x}

    return grain.DataLoader(
        data_source=grain.RangeDataSource(0, num_records, 1),
        sampler=grain.IndexSampler(
            num_records, grain.NoSharding(), shuffle=True, num_epochs=1, seed=seed
        ),
        operations=[Square(), grain.Batch(4)],
        worker_count=worker_count,
    )


@functools.lru_cache(maxsize=None)
def reference(worker_count):
    """One uninterrupted run: batch ids, and the state after k batches at [k]."""
    with iter(make_loader(worker_count)) as it:
        states, batch_ids = [it.get_state()], []
        for b in it:
            batch_ids.append(b["id"].tolist())
            states.append(it.get_state())
    return batch_ids, states


def ids(it):
    return [b["id"].tolist() for b in it]


def test_import_grainlike_loads_neither_jax_nor_orbax():
    code = (
        "import sys, grainlike, grainlike.python, grainlike.checkpoint, grainlike.jax.device_iterator\n"
        "from grainlike.python import *\n"
        "bad = [m for m in ('jax', 'orbax', 'orbax.checkpoint') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=ROOT)


@pytest.mark.parametrize("worker_count", WORKERS)
def test_manager_restore_continues_identically(tmp_path, worker_count):
    expected, states = reference(worker_count)
    k = 5
    with ocp.CheckpointManager(tmp_path) as mngr, iter(make_loader(worker_count)) as it:
        for _ in range(k):
            next(it)
        mngr.save(k, args=gckpt.PyGrainCheckpointSave(it))
        mngr.wait_until_finished()
    # grain's layout and grain's JSON, byte for byte.
    assert (tmp_path / "5" / "default" / "process_0-of-1.json").read_bytes() == states[k]

    with ocp.CheckpointManager(tmp_path) as mngr, iter(make_loader(worker_count)) as it:
        restored = mngr.restore(mngr.latest_step(), args=gckpt.PyGrainCheckpointRestore(it))
        assert restored is it
        assert ids(it) == expected[k:]


@pytest.mark.parametrize("worker_count", WORKERS)
def test_async_save_captures_state_when_save_is_called(tmp_path, worker_count):
    expected, states = reference(worker_count)
    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True)
    with ocp.CheckpointManager(tmp_path, options=options) as mngr, iter(
        make_loader(worker_count)
    ) as it:
        next(it), next(it)
        mngr.save(
            2,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(params), data_iter=gckpt.PyGrainCheckpointSave(it)
            ),
        )
        # The write is still in flight; moving on must not change what it writes.
        for _ in range(3):
            next(it)
        mngr.wait_until_finished()
    assert (tmp_path / "2" / "data_iter" / "process_0-of-1.json").read_bytes() == states[2]

    with ocp.CheckpointManager(tmp_path) as mngr, iter(make_loader(worker_count)) as it:
        abstract = jax.tree.map(jnp.zeros_like, params)
        restored = mngr.restore(
            2,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract),
                data_iter=gckpt.PyGrainCheckpointRestore(it),
            ),
        )
        jax.tree.map(np.testing.assert_array_equal, restored.state, params)
        assert restored.data_iter is it
        assert ids(it) == expected[2:]


def test_restoring_a_missing_step_raises(tmp_path):
    with ocp.CheckpointManager(tmp_path) as mngr, iter(make_loader()) as it:
        mngr.save(1, args=gckpt.PyGrainCheckpointSave(it))
        mngr.wait_until_finished()
        with pytest.raises(FileNotFoundError, match=r"/7 not found"):
            mngr.restore(7, args=gckpt.PyGrainCheckpointRestore(it))
    # A step saved without the data iterator: Orbax names the items it has.
    with ocp.CheckpointManager(tmp_path / "model_only") as mngr, iter(make_loader()) as it:
        mngr.save(2, args=ocp.args.Composite(state=ocp.args.StandardSave({"a": jnp.ones(2)})))
        mngr.wait_until_finished()
        with pytest.raises(KeyError, match="data_iter.*was not found"):
            mngr.restore(2, args=ocp.args.Composite(data_iter=gckpt.PyGrainCheckpointRestore(it)))


def test_restoring_another_pipeline_names_the_file_and_changes_nothing(tmp_path):
    with ocp.CheckpointManager(tmp_path) as mngr, iter(make_loader()) as it:
        next(it)
        mngr.save(1, args=gckpt.PyGrainCheckpointSave(it))
        mngr.wait_until_finished()
    expected = reference(0)[0]
    with ocp.CheckpointManager(tmp_path) as mngr, iter(make_loader(seed=8)) as other:
        with pytest.raises(grain.InvalidStateError, match=r"process_0-of-1\.json.*Sampler"):
            mngr.restore(1, args=gckpt.PyGrainCheckpointRestore(other))
    with ocp.CheckpointManager(tmp_path) as mngr, iter(make_loader()) as it:
        next(it)
        with pytest.raises(grain.InvalidStateError, match="num_records=40"):
            mngr.restore(1, args=gckpt.PyGrainCheckpointRestore(iter(make_loader(num_records=40))))
        assert ids(it) == expected[1:]


def test_restoring_with_another_process_count_says_so(tmp_path):
    with ocp.CheckpointManager(tmp_path) as mngr, iter(make_loader()) as it:
        mngr.save(1, args=gckpt.PyGrainCheckpointSave(it))
        mngr.wait_until_finished()
        item = tmp_path / "1" / "default"
        (item / "process_0-of-1.json").rename(item / "process_0-of-2.json")
        with pytest.raises(
            ValueError,
            match=re.escape("process_0-of-1.json does not exist")
            + r".*process 0 of 1.*process_0-of-2\.json",
        ):
            mngr.restore(1, args=gckpt.PyGrainCheckpointRestore(it))


@pytest.mark.parametrize("worker_count", WORKERS)
def test_device_iterator_checkpoints_the_batches_handed_out(tmp_path, worker_count):
    expected, states = reference(worker_count)
    with ocp.CheckpointManager(tmp_path) as mngr, DeviceIterator(
        iter(make_loader(worker_count)), prefetch=3
    ) as it:
        for _ in range(4):
            next(it)
        mngr.save(4, args=gckpt.PyGrainCheckpointSave(it))
        next(it)
        mngr.wait_until_finished()
    assert (tmp_path / "4" / "default" / "process_0-of-1.json").read_bytes() == states[4]
    with ocp.CheckpointManager(tmp_path) as mngr, DeviceIterator(
        iter(make_loader(worker_count)), prefetch=3
    ) as it:
        mngr.restore(4, args=gckpt.PyGrainCheckpointRestore(it))
        assert [np.asarray(b["id"]).tolist() for b in it] == expected[4:]


def test_sync_checkpointer_writes_the_same_file(tmp_path):
    _, states = reference(0)
    with iter(make_loader()) as it:
        next(it)
        with ocp.Checkpointer(gckpt.PyGrainCheckpointHandler()) as ckptr:
            ckptr.save(tmp_path / "ckpt", args=gckpt.PyGrainCheckpointSave(it))
    assert (tmp_path / "ckpt" / "process_0-of-1.json").read_bytes() == states[1]


def test_orbax_v1_saves_and_loads_a_stateful_checkpointable(tmp_path):
    v1 = pytest.importorskip("orbax.checkpoint.experimental.v1")
    expected, states = reference(0)
    with DeviceIterator(iter(make_loader()), prefetch=2) as it:
        next(it), next(it), next(it)
        v1.save_checkpointables(tmp_path / "ckpt", {"data_iter": it})
    assert (tmp_path / "ckpt" / "data_iter" / "process_0-of-1.json").read_bytes() == states[3]
    with DeviceIterator(iter(make_loader()), prefetch=2) as it:
        v1.load_checkpointables(tmp_path / "ckpt", {"data_iter": it})
        assert [np.asarray(b["id"]).tolist() for b in it] == expected[3:]


def test_data_loader_iterator_is_an_orbax_v1_checkpointable(tmp_path):
    v1 = pytest.importorskip("orbax.checkpoint.experimental.v1")
    expected, states = reference(0)
    with iter(make_loader()) as it:
        next(it)
        v1.save_checkpointables(tmp_path / "ckpt", {"data_iter": it})
    assert (tmp_path / "ckpt" / "data_iter" / "process_0-of-1.json").read_bytes() == states[1]
    with iter(make_loader()) as it:
        v1.load_checkpointables(tmp_path / "ckpt", {"data_iter": it})
        assert ids(it) == expected[1:]


def test_args_need_an_iterator_with_state():
    with pytest.raises(TypeError, match=r"PyGrainCheckpointSave takes an iterator.*list.*get_state"):
        gckpt.PyGrainCheckpointSave([1, 2, 3])
    with pytest.raises(TypeError, match=r"PyGrainCheckpointRestore takes.*set_state"):
        gckpt.PyGrainCheckpointRestore(None)


def test_top_level_names_are_the_checkpoint_classes():
    import grainlike.python

    for name in ("PyGrainCheckpointHandler", "PyGrainCheckpointSave", "PyGrainCheckpointRestore"):
        assert getattr(grain, name) is getattr(gckpt, name)
        assert getattr(grainlike.python, name) is getattr(gckpt, name)
    # grain.checkpoint's names for the same classes.
    assert gckpt.CheckpointHandler is gckpt.PyGrainCheckpointHandler
    assert gckpt.CheckpointSave is gckpt.PyGrainCheckpointSave
    assert gckpt.CheckpointRestore is gckpt.PyGrainCheckpointRestore


def test_handler_names_are_stable():
    # Orbax records the typestr in every checkpoint's metadata.
    assert gckpt.PyGrainCheckpointHandler.typestr() == "grainlike.checkpoint.PyGrainCheckpointHandler"
    assert ocp.args.get_registered_handler_cls(gckpt.PyGrainCheckpointSave) is (
        gckpt.PyGrainCheckpointHandler
    )
    assert ocp.args.get_registered_handler_cls(gckpt.PyGrainCheckpointRestore) is (
        gckpt.PyGrainCheckpointHandler
    )


# --- docs --------------------------------------------------------------------


def _doc_blocks(name):
    text = (ROOT / "docs" / name).read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_docs_checkpointing_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = _doc_blocks("checkpointing.md")
    assert len(blocks) >= 3
    namespace: dict = {"__name__": "docs_checkpointing"}
    # The last block is the crash-safe training script; test_crash_resume runs it.
    for block in blocks[:-1]:  # later blocks use names from earlier ones
        exec(compile(block, "docs/checkpointing.md", "exec"), namespace)
    assert json.loads((tmp_path / "checkpoints" / "3" / "data_iter" / "process_0-of-1.json").read_text())


# --- Dataset iterators ------------------------------------------------------------


def make_dataset(num_records=30, seed=4):
    return (
        grain.MapDataset.range(num_records)
        .shuffle(seed=seed)
        .map(lambda x: {"id": np.int64(x)})
        .to_iter_dataset()
        .batch(4)
    )


def dataset_ids(it):
    return [b["id"].tolist() for b in it]


def test_dataset_iterator_restores_through_a_manager(tmp_path):
    expected = dataset_ids(iter(make_dataset()))
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True)
    with ocp.CheckpointManager(tmp_path, options=options) as mngr:
        it = iter(make_dataset())
        next(it), next(it)
        state = it.get_state()
        mngr.save(2, args=ocp.args.Composite(data_iter=gckpt.CheckpointSave(it)))
        next(it)  # moving on does not change what is written
        mngr.wait_until_finished()
    written = (tmp_path / "2" / "data_iter" / "process_0-of-1.json").read_text()
    assert json.loads(written) == state
    assert written == json.dumps(state, indent=4)
    with ocp.CheckpointManager(tmp_path) as mngr:
        it = iter(make_dataset())
        restored = mngr.restore(2, args=ocp.args.Composite(data_iter=gckpt.CheckpointRestore(it)))
        assert restored.data_iter is it
        assert dataset_ids(it) == expected[2:]


def test_restoring_another_dataset_names_the_file_and_keeps_the_error_type(tmp_path):
    with ocp.CheckpointManager(tmp_path) as mngr:
        it = iter(make_dataset())
        next(it)
        mngr.save(1, args=gckpt.CheckpointSave(it))
        mngr.wait_until_finished()
    # A different pipeline: the saved state has no place in it.
    other = iter(grain.MapDataset.range(3).to_iter_dataset())
    with pytest.raises(Exception) as direct:
        other.set_state(json.loads((tmp_path / "1" / "default" / "process_0-of-1.json").read_text()))
    other = iter(grain.MapDataset.range(3).to_iter_dataset())
    with ocp.CheckpointManager(tmp_path) as mngr:
        with pytest.raises(type(direct.value)) as through_orbax:
            mngr.restore(1, args=gckpt.CheckpointRestore(other))
    assert "process_0-of-1.json" in "\n".join(
        [str(through_orbax.value), *getattr(through_orbax.value, "__notes__", [])]
    )


def test_save_state_async_writes_a_dataset_state_as_indented_json(tmp_path):
    import asyncio

    it = iter(make_dataset())
    next(it)
    state = it.get_state()
    # As Orbax v1 does: the state is read when save() is awaited, the file is
    # written when the coroutine it returns is.
    write = asyncio.run(gckpt.save_state_async(it, tmp_path))
    next(it)
    asyncio.run(write)
    assert (tmp_path / "process_0-of-1.json").read_text() == json.dumps(state, indent=4)
    fresh = iter(make_dataset())
    asyncio.run(asyncio.run(gckpt.load_state_async(fresh, tmp_path)))
    assert fresh.get_state() == state


def test_dataset_iterator_is_an_orbax_v1_checkpointable(tmp_path):
    v1 = pytest.importorskip("orbax.checkpoint.experimental.v1")
    expected = dataset_ids(iter(make_dataset()))
    it = iter(make_dataset())
    next(it)
    v1.save_checkpointables(tmp_path / "ckpt", {"data_iter": it})
    it = iter(make_dataset())
    v1.load_checkpointables(tmp_path / "ckpt", {"data_iter": it})
    assert dataset_ids(it) == expected[1:]


# --- any iterator with get_state/set_state ---------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_device_iterator_over_a_dataset_iterator_restores_through_a_manager(tmp_path, no_leaks, num_workers):
    def make():
        ds = make_dataset()
        if num_workers:
            ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
        return DeviceIterator(iter(ds), prefetch=2)

    with make() as it:
        expected = [np.asarray(b["id"]).tolist() for b in it]
    with ocp.CheckpointManager(tmp_path) as mngr, make() as it:
        next(it), next(it), next(it)
        state = it.get_state()
        mngr.save(3, args=ocp.args.Composite(data_iter=gckpt.CheckpointSave(it)))
        next(it)
        mngr.wait_until_finished()
    # grain's bytes for a Dataset iterator's state, though the DeviceIterator wraps it.
    written = (tmp_path / "3" / "data_iter" / "process_0-of-1.json").read_text()
    assert written == json.dumps(state, indent=4)
    with ocp.CheckpointManager(tmp_path) as mngr, make() as it:
        mngr.restore(3, args=ocp.args.Composite(data_iter=gckpt.CheckpointRestore(it)))
        assert it.get_state() == state
        assert [np.asarray(b["id"]).tolist() for b in it] == expected[3:]


class _CountingIterator:
    """Neither a DataLoader nor a Dataset iterator: a dict state of its own."""

    def __init__(self):
        self.position = 0

    def __next__(self):
        self.position += 1
        return self.position

    def get_state(self):
        return {"position": self.position}

    def set_state(self, state):
        self.position = state["position"]


def test_any_iterator_with_a_dict_state_restores_through_a_manager(tmp_path):
    it = _CountingIterator()
    next(it), next(it)
    with ocp.CheckpointManager(tmp_path) as mngr:
        mngr.save(2, args=ocp.args.Composite(data_iter=gckpt.CheckpointSave(it)))
        mngr.wait_until_finished()
    assert (tmp_path / "2" / "data_iter" / "process_0-of-1.json").read_text() == json.dumps(
        {"position": 2}, indent=4
    )
    restored = _CountingIterator()
    with ocp.CheckpointManager(tmp_path) as mngr:
        mngr.restore(2, args=ocp.args.Composite(data_iter=gckpt.CheckpointRestore(restored)))
    assert next(restored) == 3


class _StateOnly:
    """A user iterator wrapper with only the method one side of a checkpoint calls."""

    def __init__(self, state=None):
        self.state = state

    def get_state(self):
        return self.state


class _RestoreOnly:
    def set_state(self, state):
        self.state = state


def test_save_needs_only_get_state_and_restore_only_set_state(tmp_path):
    # grain's handler calls get_state() to save and set_state() to restore, nothing else.
    with ocp.CheckpointManager(tmp_path) as mngr:
        mngr.save(1, args=gckpt.PyGrainCheckpointSave(_StateOnly({"next_index": 3})))
        mngr.wait_until_finished()
    assert json.loads((tmp_path / "1" / "default" / "process_0-of-1.json").read_text()) == {"next_index": 3}
    target = _RestoreOnly()
    with ocp.CheckpointManager(tmp_path) as mngr:
        mngr.restore(1, args=gckpt.PyGrainCheckpointRestore(target))
    # Without get_state() to say which form it takes, the state comes as the file's bytes.
    assert json.loads(target.state) == {"next_index": 3}
    with pytest.raises(TypeError, match=r"has no get_state\(\)$"):
        gckpt.PyGrainCheckpointSave(_RestoreOnly())
    with pytest.raises(TypeError, match=r"has no set_state\(\)$"):
        gckpt.PyGrainCheckpointRestore(_StateOnly())
