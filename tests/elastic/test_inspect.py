"""grainlike-inspect --workers / --processes: what an elastic restore would do, in words."""

from __future__ import annotations

import re

import numpy as np
import pytest

import grainlike as grain
from grainlike.loader import elastic_restore as elastic
from grainlike.loader.legacy_state import dumps
from grainlike.tools import inspect_cli as inspect

RECORDS, EPOCHS = 24, 2


def _loader(index: int, count: int, workers: int = 0) -> grain.DataLoader:
    shard = grain.ShardOptions(index, count, drop_remainder=True)
    return grain.DataLoader(
        data_source=grain.RangeDataSource(0, RECORDS, 1),
        sampler=grain.IndexSampler(RECORDS, shard, shuffle=True, num_epochs=EPOCHS, seed=5),
        operations=[grain.Batch(2)],
        worker_count=workers,
    )


@pytest.fixture
def checkpoint(tmp_path):
    """A checkpoint of 2 processes, 3 steps each, without workers."""
    for i in range(2):
        with iter(_loader(i, 2)) as it:
            for _ in range(3):
                next(it)
            (tmp_path / f"process_{i}-of-2.json").write_bytes(it.get_state())
    return tmp_path


def _remaining(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"(\d+) remain", text)]


@pytest.mark.timeout(60)
def test_process_count_change_shows_the_records_each_new_process_delivers(checkpoint, no_leaks):
    text = inspect.describe_path_restore(str(checkpoint), processes=3)
    states = {i: (checkpoint / f"process_{i}-of-2.json").read_bytes() for i in range(2)}
    delivered = []
    for j in range(3):
        loader = _loader(j, 3)
        with iter(loader) as it:
            it.set_state(dumps(loader._codec.encode(elastic.process_states(loader, states, 2))))
            delivered.append(sum(np.asarray(b).size for b in it))
    assert _remaining(text) == delivered
    # 12 records delivered of 48; the 3 new processes deliver equal shares of the
    # rest (drop_remainder sharding drops the extra ones of the epoch under way).
    assert len(set(delivered)) == 1
    assert RECORDS * EPOCHS - 12 - 3 <= sum(delivered) <= RECORDS * EPOCHS - 12


@pytest.mark.timeout(60)
def test_worker_count_change_shows_where_each_worker_starts(checkpoint, no_leaks):
    text = inspect.describe_path_restore(str(checkpoint / "process_1-of-2.json"), workers=3)
    # 6 positions delivered by one worker: 3 workers start at 2 positions each.
    assert "process 1: next positions per worker [2, 2, 2]" in text
    assert _remaining(text) == [24 - 6]


@pytest.mark.timeout(60)
def test_another_sampler_cannot_change_process_count(tmp_path, no_leaks):
    loader = grain.DataLoader(
        data_source=grain.RangeDataSource(0, 8, 1),
        sampler=grain.SequentialSampler(8, grain.ShardOptions(0, 1)),
        worker_count=0,
    )
    with iter(loader) as it:
        next(it)
        (tmp_path / "process_0-of-1.json").write_bytes(it.get_state())
    text = inspect.describe_path_restore(str(tmp_path), processes=2)
    assert "cannot restore" in text and "not an IndexSampler" in text


@pytest.mark.timeout(60)
def test_command_line_prints_the_restore(checkpoint, capsys):
    assert inspect.main([str(checkpoint), "--workers", "2", "--processes", "1"]) == 0
    out = capsys.readouterr().out
    assert "Restore of the states of 2 processes on 1 process with 2 workers" in out
