"""Hostile states, given to ``set_state`` directly or read from a checkpoint's state file.

A state nested 100,000 levels deep, a structure that contains itself, an empty
file, a pickle where JSON belongs: each is refused with ``InvalidStateError``
(naming the file it came from, if any) before the iterator changes, never with a
``RecursionError`` or a bare decoding error. Where grain raises a ``KeyError`` or
``TypeError`` on such a state, the error is one too (tests/compat/
test_hostile_state_compat.py compares with grain).
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import pickle

import pytest

import grainlike as grain
from grainlike import InvalidStateError
from grainlike.core import state_files
from grainlike.core.state_depth import MAX_STATE_DEPTH
from tests.reliability.test_bad_iterator_state import DATASETS, TAKEN, _same

DEEP = 100_000


def _deep_dict(depth: int, leaf=0) -> dict:
    state = leaf
    for _ in range(depth):
        state = {"a": state}
    return state


def _deep_list(depth: int, leaf=0) -> list:
    state = leaf
    for _ in range(depth):
        state = [state]
    return state


def _first_leaf_replaced(state, value):
    """``state`` (JSON-like) with its first non-container value replaced by ``value``."""
    if isinstance(state, dict):
        for key, child in state.items():
            if isinstance(child, (dict, list)) and child:
                return {**state, key: _first_leaf_replaced(child, value)}
            return {**state, key: value}
    if isinstance(state, list) and state:
        return [_first_leaf_replaced(state[0], value)] + state[1:]
    return value


def _self_containing(state):
    bad = json.loads(json.dumps(state))
    holder = bad if isinstance(bad, dict) else {"x": bad}
    holder["loop"] = holder
    return bad if isinstance(bad, dict) else holder


HOSTILE = {
    "deep_dict": lambda state: _deep_dict(DEEP),
    "deep_list": lambda state: _deep_list(DEEP),
    "deep_under_every_key": lambda state: {key: _deep_dict(DEEP) for key in state},
    "deep_in_a_nested_value": lambda state: _first_leaf_replaced(state, _deep_list(DEEP)),
    "self_containing": _self_containing,
    "just_over_the_limit": lambda state: {key: _deep_list(MAX_STATE_DEPTH) for key in state},
}


def _started(name: str):
    it = iter(DATASETS[name]())
    for _ in range(TAKEN):
        next(it)
    return it


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hostile", sorted(HOSTILE))
@pytest.mark.parametrize("name", sorted(DATASETS))
def test_a_hostile_state_given_directly_is_an_invalid_state_error_and_changes_nothing(name, hostile):
    expected = [x for _, x in zip(range(TAKEN + 1), iter(DATASETS[name]()))]
    it = _started(name)
    bad = HOSTILE[hostile](it.get_state())
    try:
        with pytest.raises(InvalidStateError) as info:
            it.set_state(bad)
        assert "state" in str(info.value)
        assert not isinstance(info.value, RecursionError)
        if hostile in ("deep_dict", "deep_list"):
            # Where grain fails on a missing key or a wrong type, so does this.
            assert isinstance(info.value, (KeyError, TypeError))
        assert _same(next(it), expected[TAKEN])
    finally:
        it.close()


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_the_deepest_real_states_are_far_from_the_limit(name):
    """Every stage's own state passes the depth check (with room for pipelines of many stages)."""
    it = _started(name)
    try:
        state = it.get_state()
        depth, pending = 0, [(state, 1)]
        while pending:
            value, d = pending.pop()
            if isinstance(value, (dict, list)):
                depth = max(depth, d)
                pending.extend((c, d + 1) for c in (value.values() if isinstance(value, dict) else value))
        assert depth <= 10, depth
        it.set_state(state)
    finally:
        it.close()


def test_a_pipeline_of_many_stages_restores(tmp_path):
    ds = grain.MapDataset.range(100).to_iter_dataset()
    for _ in range(30):  # each window shuffle nests its parent's state one level down
        ds = grain.experimental.WindowShuffleIterDataset(ds, window_size=2, seed=1)
    it = iter(ds)
    next(it)
    state = it.get_state()
    rest = list(it)
    it = iter(ds)
    it.set_state(state)
    assert list(it) == rest


# -- state files -------------------------------------------------------------------------


def _load(it, directory: pathlib.Path) -> None:
    async def run():
        await (await state_files.load_state_async(it, directory))

    asyncio.run(run())


BAD_FILES = {
    "empty": b"",
    "pickle": pickle.dumps({"next_index": 1}),
    "pickle_protocol_0": pickle.dumps({"next_index": 1}, protocol=0),
    "deep_json": b"[" * DEEP + b"]" * DEEP,
    "deep_json_object": b'{"a":' * DEEP + b"0" + b"}" * DEEP,
    "deep_json_that_parses": b'{"next_index": ' + b"[" * 500 + b"]" * 500 + b"}",
    "not_utf8": b'{"next_index": "\xff\xfe"}',
    "huge_int": b'{"next_index": ' + b"9" * 5000 + b"}",
}


def _message_and_notes(error: BaseException) -> str:
    return " ".join([str(error), *getattr(error, "__notes__", [])])


@pytest.mark.parametrize("content", sorted(BAD_FILES))
def test_a_bad_state_file_of_a_dataset_iterator_is_an_invalid_state_error_naming_it(tmp_path, content):
    path = tmp_path / "process_0-of-1.json"
    path.write_bytes(BAD_FILES[content])
    it = iter(grain.MapDataset.range(10).to_iter_dataset())
    next(it)
    with pytest.raises(InvalidStateError) as info:
        _load(it, tmp_path)
    assert str(path) in _message_and_notes(info.value)
    assert next(it) == 1


@pytest.mark.parametrize("content", ["empty", "pickle", "deep_json", "not_utf8"])
def test_a_bad_state_file_is_named_as_the_file_itself_for_parse_errors(tmp_path, content):
    path = tmp_path / "process_0-of-1.json"
    path.write_bytes(BAD_FILES[content])
    it = iter(grain.MapDataset.range(10).to_iter_dataset())
    with pytest.raises(InvalidStateError, match="does not hold a JSON state") as info:
        _load(it, tmp_path)
    assert str(path) in str(info.value)
    assert type(info.value) is InvalidStateError  # not a RecursionError, JSONDecodeError or UnicodeDecodeError


def test_one_bad_file_of_another_process_count_is_named(tmp_path):
    it = iter(grain.MapDataset.range(10).to_iter_dataset())
    next(it)
    (tmp_path / "process_0-of-2.json").write_text(json.dumps(it.get_state(), indent=4))
    (tmp_path / "process_1-of-2.json").write_bytes(BAD_FILES["deep_json"])
    with pytest.raises(InvalidStateError, match=r"process_\*-of-2\.json: process_1-of-2\.json does not hold a JSON state"):
        _load(iter(grain.MapDataset.range(10).to_iter_dataset()), tmp_path)


def _loader():
    return grain.DataLoader(
        data_source=grain.RangeDataSource(0, 20, 1),
        sampler=grain.IndexSampler(20, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
        worker_count=0,
    )


@pytest.mark.parametrize("content", ["empty", "pickle", "pickle_protocol_0", "deep_json", "deep_json_object", "not_utf8"])
def test_a_bad_state_file_of_a_data_loader_iterator_is_an_invalid_state_error_naming_it(tmp_path, content):
    path = tmp_path / "process_0-of-1.json"
    path.write_bytes(BAD_FILES[content])
    with iter(_loader()) as it:
        first = next(it)
        with pytest.raises(InvalidStateError) as info:
            _load(it, tmp_path)
        assert str(path) in _message_and_notes(info.value)
        assert next(it) == first + 1


@pytest.mark.parametrize("content", ["empty", "pickle", "deep_json"])
def test_the_orbax_handler_refuses_a_bad_state_file_naming_it(tmp_path, content):
    pytest.importorskip("orbax.checkpoint")
    from grainlike import checkpoint as gckpt

    path = tmp_path / "process_0-of-1.json"
    path.write_bytes(BAD_FILES[content])
    it = iter(grain.MapDataset.range(10).to_iter_dataset())
    with pytest.raises(InvalidStateError) as info:
        gckpt.PyGrainCheckpointHandler().restore(tmp_path, args=gckpt.PyGrainCheckpointRestore(it))
    assert str(path) in _message_and_notes(info.value)
