"""Orbax checkpoints move between grain 0.2.18 and grainlike, in both directions.

Each side writes with its own handler through a real ``ocp.CheckpointManager``,
next to model state, and the other side restores with its own handler and
continues with exactly the elements the writer's uninterrupted run yields; for
DataLoader iterators and for Dataset iterators, through Orbax v0 and v1.
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

import grainlike
from grainlike import checkpoint as gckpt
from tests.helpers.pipelines import build, take

pytestmark = pytest.mark.timeout(120)

N = 37
K = 4  # batches consumed before the checkpoint


def _loader(lib, worker_count):
    return build(lib, list(range(N)), num_records=N, num_epochs=2, shuffle=True, seed=5,
                 ops=["map", "rand", "batch"], batch_size=3, worker_count=worker_count)


def _grain_args(grain_ref):
    return grain_ref.PyGrainCheckpointSave, grain_ref.PyGrainCheckpointRestore


def _grainlike_args(grain_ref):
    del grain_ref
    return gckpt.PyGrainCheckpointSave, gckpt.PyGrainCheckpointRestore


PARAMS = {"w": jnp.arange(4.0), "b": jnp.float32(2.0)}


def _save(path, it, save_args):
    with ocp.CheckpointManager(path) as mngr:
        mngr.save(K, args=ocp.args.Composite(
            state=ocp.args.StandardSave(PARAMS), data_iter=save_args(it)))
        mngr.wait_until_finished()


def _restore(path, it, restore_args):
    with ocp.CheckpointManager(path) as mngr:
        restored = mngr.restore(K, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(PARAMS), data_iter=restore_args(it)))
    np.testing.assert_array_equal(np.asarray(restored.state["w"]), np.asarray(PARAMS["w"]))
    return restored.data_iter


def _close(it):
    close = getattr(it, "close", None)
    if close is not None:
        close()


# grain's worker processes take ~10 s to start here, so W=2 runs in the direction
# users migrate in; tests/compat/test_workers_compat.py cross-restores W>0 state
# both ways, and the Orbax layer does not depend on W.
@pytest.mark.parametrize(
    "direction,worker_count",
    [("grain_to_grainlike", 0), ("grainlike_to_grain", 0), ("grain_to_grainlike", 2)],
)
def test_checkpoint_restores_in_the_other_library(grain_ref, tmp_path, worker_count, direction):
    writer_lib, reader_lib = (
        (grain_ref, grainlike) if direction == "grain_to_grainlike" else (grainlike, grain_ref)
    )
    writer_args = _grain_args if writer_lib is grain_ref else _grainlike_args
    reader_args = _grain_args if reader_lib is grain_ref else _grainlike_args

    it = iter(_loader(writer_lib, worker_count))
    take(it, K)
    state = it.get_state()
    _save(tmp_path, it, writer_args(grain_ref)[0])
    # The writer's own continuation is what the reader must yield.
    expected_rest = take(it, 1000)
    _close(it)
    written = (tmp_path / str(K) / "data_iter" / "process_0-of-1.json").read_bytes()
    assert written == state

    other = iter(_loader(reader_lib, worker_count))
    restored = _restore(tmp_path, other, reader_args(grain_ref)[1])
    assert restored is other
    assert take(other, 1000) == expected_rest
    _close(other)


def test_both_handlers_write_the_same_bytes(grain_ref, tmp_path):
    ig, il = iter(_loader(grain_ref, 0)), iter(_loader(grainlike, 0))
    take(ig, K), take(il, K)
    _save(tmp_path / "grain", ig, grain_ref.PyGrainCheckpointSave)
    _save(tmp_path / "grainlike", il, gckpt.PyGrainCheckpointSave)
    rel = f"{K}/data_iter/process_0-of-1.json"
    assert (tmp_path / "grain" / rel).read_bytes() == (tmp_path / "grainlike" / rel).read_bytes()


def test_grain_handler_checkpoints_a_grainlike_device_iterator(grain_ref, tmp_path):
    # Code that keeps grain's handler (grain.python.PyGrainCheckpointSave) works
    # with grainlike's iterators too: the handler only calls get_state/set_state.
    from grainlike.jax.device_iterator import DeviceIterator

    expected = take(iter(_loader(grainlike, 0)), 1000)
    with DeviceIterator(iter(_loader(grainlike, 0)), prefetch=2) as it:
        take(it, K)
        _save(tmp_path, it, grain_ref.PyGrainCheckpointSave)
    with DeviceIterator(iter(_loader(grainlike, 0)), prefetch=2) as it:
        _restore(tmp_path, it, grain_ref.PyGrainCheckpointRestore)
        got = [np.asarray(b["x"]).tolist() for b in it]
    assert got == [b["x"][-1] for b in expected[K:]]  # (type, dtype, shape, values)


# --- Dataset iterators ----------------------------------------------------------


def _dataset_iter(lib):
    return iter(
        lib.MapDataset.range(23).shuffle(seed=5).map(lambda x: x * 3).to_iter_dataset().batch(4)
    )


def _checkpoint_classes(lib):
    if lib is grainlike:
        return grainlike.checkpoint.CheckpointSave, grainlike.checkpoint.CheckpointRestore
    import grain.checkpoint

    return grain.checkpoint.CheckpointSave, grain.checkpoint.CheckpointRestore


@pytest.mark.parametrize("direction", ["grain_to_grainlike", "grainlike_to_grain"])
def test_dataset_iterator_checkpoint_restores_in_the_other_library(grain_ref, tmp_path, direction):
    writer, reader = (grain_ref, grainlike) if direction == "grain_to_grainlike" else (grainlike, grain_ref)
    it = _dataset_iter(writer)
    take(it, 2)
    state = it.get_state()
    _save(tmp_path, it, _checkpoint_classes(writer)[0])
    expected_rest = take(it, 1000)
    written = (tmp_path / str(K) / "data_iter" / "process_0-of-1.json").read_text()
    # grain's format for a Dataset iterator: its state dict as indented JSON.
    assert written == json.dumps(state, indent=4)

    other = _dataset_iter(reader)
    restored = _restore(tmp_path, other, _checkpoint_classes(reader)[1])
    assert restored is other
    assert other.get_state() == state
    assert take(other, 1000) == expected_rest


def test_both_handlers_write_the_same_dataset_iterator_bytes(grain_ref, tmp_path):
    ig, il = _dataset_iter(grain_ref), _dataset_iter(grainlike)
    take(ig, 3), take(il, 3)
    _save(tmp_path / "grain", ig, _checkpoint_classes(grain_ref)[0])
    _save(tmp_path / "grainlike", il, _checkpoint_classes(grainlike)[0])
    rel = f"{K}/data_iter/process_0-of-1.json"
    assert (tmp_path / "grain" / rel).read_bytes() == (tmp_path / "grainlike" / rel).read_bytes()


@pytest.mark.parametrize("direction", ["grain_to_grainlike", "grainlike_to_grain"])
def test_orbax_v1_dataset_iterator_checkpoint_moves_between_libraries(grain_ref, tmp_path, direction):
    v1 = pytest.importorskip("orbax.checkpoint.experimental.v1")
    writer, reader = (grain_ref, grainlike) if direction == "grain_to_grainlike" else (grainlike, grain_ref)
    it = _dataset_iter(writer)
    take(it, 2)
    state = it.get_state()
    v1.save_checkpointables(tmp_path / "ckpt", {"data_iter": it})
    expected_rest = take(it, 1000)
    written = (tmp_path / "ckpt" / "data_iter" / "process_0-of-1.json").read_text()
    assert written == json.dumps(state, indent=4)
    other = _dataset_iter(reader)
    v1.load_checkpointables(tmp_path / "ckpt", {"data_iter": other})
    assert take(other, 1000) == expected_rest


def test_grainlike_handler_restores_a_grain_dataset_iterator(grain_ref, tmp_path):
    # grain's own Dataset iterator, saved and restored through grainlike's handler.
    it = _dataset_iter(grain_ref)
    take(it, 3)
    _save(tmp_path, it, _checkpoint_classes(grainlike)[0])
    expected_rest = take(it, 1000)
    other = _dataset_iter(grain_ref)
    _restore(tmp_path, other, _checkpoint_classes(grainlike)[1])
    assert take(other, 1000) == expected_rest
