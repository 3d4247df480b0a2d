"""``save_elastic_iterator`` / ``restore_elastic_iterator``: one ``shard_state_{i}.json`` per data shard.

The behaviour of grain's main branch (``grain._src.python.checkpoint.
elastic_checkpoint``, newer than 0.2.18, which has none): the file names and
contents of its own tests, and, over a real grainlike pipeline of data shards
spread over processes, a checkpoint of one number of processes restored on
another that delivers every element exactly once. The Orbax handler writes
the files beside the process files and restores from them on another process
count, as grain main's handler does.
"""

from __future__ import annotations

import collections
import json
from typing import Any

import pytest

import grainlike as grain
from grainlike.checkpoint import elastic_checkpoint
from grainlike.core import state_files

pytestmark = pytest.mark.timeout(60)


class _Mock:
    """The iterator of grain main's elastic_checkpoint_test: it records what it is given."""

    def __init__(self, shard_options, states=None):
        self.shard_options = shard_options
        self._states = states if states is not None else {}
        self.updated_states = {}

    def get_shard_states(self):
        return self._states

    def set_shard_states(self, state):
        for k, v in state.items():
            self.updated_states[int(k)] = v


def test_each_shard_state_is_written_to_its_file_as_indented_json_and_read_back(tmp_path):
    states = {0: {"val": 0}, 1: {"val": 1}}
    elastic_checkpoint.save_elastic_iterator(tmp_path, _Mock(grain.ShardOptions(0, 1), states))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard_state_0.json", "shard_state_1.json"]
    assert (tmp_path / "shard_state_0.json").read_text() == json.dumps({"val": 0}, indent=4)
    assert (tmp_path / "shard_state_1.json").read_text() == json.dumps({"val": 1}, indent=4)

    restored = _Mock(grain.ShardOptions(0, 1))
    elastic_checkpoint.restore_elastic_iterator(tmp_path, restored)
    assert restored.updated_states == states


def test_each_process_restores_the_shards_of_its_index(tmp_path):
    states = {0: {"val": 0}, 1: {"val": 1}, 2: {"val": 2}}
    elastic_checkpoint.save_elastic_iterator(tmp_path, _Mock(grain.ShardOptions(0, 2), states))
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"shard_state_{i}.json" for i in range(3)]
    first, second = _Mock(grain.ShardOptions(0, 2)), _Mock(grain.ShardOptions(1, 2))
    elastic_checkpoint.restore_elastic_iterator(tmp_path, first)
    elastic_checkpoint.restore_elastic_iterator(tmp_path, second)
    assert first.updated_states == {0: {"val": 0}, 2: {"val": 2}}
    assert second.updated_states == {1: {"val": 1}}


def test_a_directory_without_shard_states_is_refused_naming_it(tmp_path):
    (tmp_path / "process_0-of-1.json").write_text("{}")
    with pytest.raises(ValueError, match=r"holds no shard_state_\*\.json file"):
        elastic_checkpoint.restore_elastic_iterator(tmp_path, _Mock(grain.ShardOptions(0, 1)))


def test_the_process_count_of_a_checkpoint_is_that_of_its_process_files(tmp_path):
    assert elastic_checkpoint.get_checkpoint_process_count(tmp_path) == 0
    for name in ("process_0-of-3.json", "process_2-of-3.json", "shard_state_0.json"):
        (tmp_path / name).write_text("{}")
    assert elastic_checkpoint.get_checkpoint_process_count(tmp_path) == 3


# --- A pipeline of data shards spread over processes ------------------------------

SHARDS = 5


def _shards() -> list:
    # Shards of different lengths: 7, 8, ..., 11 elements.
    return [grain.MapDataset.range(100 * i, 100 * i + 7 + i) for i in range(SHARDS)]


ALL = [x for ds in _shards() for x in ds]


class _ShardsIterator:
    """Process ``shard_index`` of ``shard_count`` reads shards ``shard_index::shard_count``, one element of each in turn.

    Each shard's state is ``{"exhausted": 0 or 1, "state": its iterator's
    state}``, the form of grain main's interleave, which its ``ElasticIterator``
    over an ``IterDataset`` saves.
    """

    def __init__(self, shard_options):
        self.shard_options = shard_options
        shards = _shards()
        mine = range(shard_options.shard_index, SHARDS, shard_options.shard_count)
        self._its = {i: iter(shards[i].to_iter_dataset()) for i in mine}
        self._exhausted = {i: 0 for i in mine}
        self._turn = 0

    def __iter__(self):
        return self

    def __next__(self) -> Any:
        while not all(self._exhausted.values()):
            order = sorted(self._its)
            i = order[self._turn % len(order)]
            self._turn += 1
            if self._exhausted[i]:
                continue
            try:
                return next(self._its[i])
            except StopIteration:
                self._exhausted[i] = 1
        raise StopIteration

    def get_shard_states(self) -> dict[int, Any]:
        return {i: {"exhausted": self._exhausted[i], "state": it.get_state()} for i, it in self._its.items()}

    def set_shard_states(self, state: dict[int, Any]) -> None:
        assert set(state) == set(self._its), "the shards of this process"
        for i, shard in state.items():
            self._exhausted[i] = shard["exhausted"]
            self._its[i].set_state(shard["state"])
        self._turn = 0

    # The process file: what a restore on the same process count reads.
    def get_state(self) -> dict:
        return {"shards": {str(i): s for i, s in self.get_shard_states().items()}, "turn": self._turn}

    def set_state(self, state: dict) -> None:
        self.set_shard_states({int(i): s for i, s in state["shards"].items()})
        self._turn = state["turn"]


def _take(it, n):
    return [int(next(it)) for _ in range(n)]


def _save_on(directory, count: int, save) -> list[int]:
    """Each of ``count`` processes reads a few elements, then saves; what they read."""
    seen = []
    for index in range(count):
        it = _ShardsIterator(grain.ShardOptions(index, count))
        seen += _take(it, 3 + 2 * index)
        save(directory, it, index, count)
    return seen


def _rest_on(directory, count: int, restore) -> list[int]:
    rest = []
    for index in range(count):
        it = _ShardsIterator(grain.ShardOptions(index, count))
        restore(directory, it, index, count)
        rest += [int(x) for x in it]
    return rest


def _helper_save(directory, it, index, count):
    del index, count
    elastic_checkpoint.save_elastic_iterator(directory, it)


def _helper_restore(directory, it, index, count):
    del index, count
    elastic_checkpoint.restore_elastic_iterator(directory, it)


@pytest.mark.parametrize("saved_on", [1, 2, 3])
@pytest.mark.parametrize("restored_on", [1, 2, 3, 4, SHARDS + 2])
def test_shards_saved_on_some_processes_restore_on_any_number_every_element_once(tmp_path, saved_on, restored_on):
    seen = _save_on(tmp_path, saved_on, _helper_save)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"shard_state_{i}.json" for i in range(SHARDS)]
    rest = _rest_on(tmp_path, restored_on, _helper_restore)
    assert collections.Counter(seen + rest) == collections.Counter(ALL)


# --- Through the Orbax handler ----------------------------------------------------


def _as_process(monkeypatch, index: int, count: int) -> None:
    monkeypatch.setattr(state_files, "_process_index_and_count", lambda: (index, count))


def test_the_handler_writes_shard_states_beside_the_process_files_and_restores_from_them_on_another_count(
    tmp_path, monkeypatch
):
    pytest.importorskip("orbax.checkpoint")
    handler = grain.checkpoint.CheckpointHandler()

    def save(directory, it, index, count):
        _as_process(monkeypatch, index, count)
        handler.save(directory, args=grain.checkpoint.CheckpointSave(it))

    def restore(directory, it, index, count):
        _as_process(monkeypatch, index, count)
        assert handler.restore(directory, args=grain.checkpoint.CheckpointRestore(it)) is it

    from_shards = []
    restore_shards = elastic_checkpoint.restore_elastic_iterator

    def counted(directory, item):
        from_shards.append(item.shard_options)
        restore_shards(directory, item)

    monkeypatch.setattr(elastic_checkpoint, "restore_elastic_iterator", counted)
    seen = _save_on(tmp_path, 2, save)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["process_0-of-2.json", "process_1-of-2.json"] + [f"shard_state_{i}.json" for i in range(SHARDS)]
    for restored_on in (1, 2, 3):
        # On 2 processes each reads its process file; on 1 and 3 the shard files.
        del from_shards[:]
        rest = _rest_on(tmp_path, restored_on, restore)
        assert collections.Counter(seen + rest) == collections.Counter(ALL)
        assert len(from_shards) == (0 if restored_on == 2 else restored_on)


def test_an_asynchronous_save_writes_the_shard_states_read_at_save(tmp_path, monkeypatch):
    ocp = pytest.importorskip("orbax.checkpoint")
    it = _ShardsIterator(grain.ShardOptions(0, 1))
    seen = _take(it, 4)
    with ocp.CheckpointManager(tmp_path) as mngr:
        mngr.save(1, args=ocp.args.Composite(data_iter=grain.checkpoint.CheckpointSave(it)))
        seen_after = _take(it, 2)  # not in the checkpoint
        mngr.wait_until_finished()
    item = tmp_path / "1" / "data_iter"
    assert sorted(p.name for p in item.glob("*.json")) == ["process_0-of-1.json"] + [
        f"shard_state_{i}.json" for i in range(SHARDS)
    ]
    rest = []
    for index in range(2):
        _as_process(monkeypatch, index, 2)
        fresh = _ShardsIterator(grain.ShardOptions(index, 2))
        grain.checkpoint.CheckpointHandler().restore(item, args=grain.checkpoint.CheckpointRestore(fresh))
        rest += [int(x) for x in fresh]
    assert collections.Counter(seen + rest) == collections.Counter(ALL)
    assert set(seen_after) <= set(rest)


def test_iterators_without_shard_states_write_only_their_process_file(tmp_path):
    pytest.importorskip("orbax.checkpoint")
    # grainlike's ElasticIterator is grain 0.2.18's: its state is shared by all
    # shards and lives in the process file alone.
    it = iter(grain.experimental.ElasticIterator(grain.MapDataset.range(16), 4, grain.ShardOptions(0, 2)))
    next(it)
    grain.checkpoint.CheckpointHandler().save(tmp_path, args=grain.checkpoint.CheckpointSave(it))
    assert [p.name for p in tmp_path.iterdir()] == ["process_0-of-1.json"]
