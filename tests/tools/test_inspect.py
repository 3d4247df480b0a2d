"""grainlike-inspect on real states and real files."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import grainlike
from grainlike.tools import convert, inspect_cli as inspect_tool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sharded_loader(workers: int):
    # 9 records, shard 1 of 2 -> records [5, 9), 4 per epoch; 2 epochs read global
    # indices 1, 3, ..., 17: 9 positions for this shard.
    shard = grainlike.ShardOptions(shard_index=1, shard_count=2, drop_remainder=False)
    return grainlike.DataLoader(
        data_source=grainlike.RangeDataSource(0, 9, 1),
        sampler=grainlike.IndexSampler(9, shard, shuffle=True, num_epochs=2, seed=5),
        operations=[grainlike.Batch(2)],
        worker_count=workers,
        shard_options=shard,
    )


@pytest.mark.timeout(60)
def test_state_of_a_real_loader_in_words(tmp_path, capsys):
    it = iter(sharded_loader(workers=2))
    for _ in range(3):  # worker 0, worker 1, worker 0: 2 + 2 + 2 positions
        next(it)
    path = tmp_path / "state.json"
    path.write_bytes(it.get_state())
    it.close()
    assert inspect_tool.main([str(path)]) == 0
    out = capsys.readouterr().out
    expected = [
        f"Checkpoint state {path}",
        "data source: RangeDataSource(start=0, stop=9, step=1)",
        "sampler: IndexSampler over 9 records, shuffled with seed 5, 2 epochs",
        "sharding: shard 1 of 2 (ShardOptions, drop_remainder=False): records [5, 9), 4 per epoch",
        "workers: 2",
        "round-robin: worker 0 produced last; worker 1 produces next",
        "worker 0: read 4 positions, last at global index 13; next is global index 17",
        "worker 1: read 2 positions, last at global index 7; next is global index 11",
        "progress: 6 positions of 9 read (66.7%): in epoch 2 of 2, 2 of its 4 records read",
    ]
    for line in expected:
        assert line in out, f"missing {line!r} in:\n{out}"


def test_fresh_and_finished_states(capsys):
    loader = sharded_loader(workers=0)
    it = iter(loader)
    fresh = inspect_tool.describe_state(it.get_state())
    assert "main process: nothing read yet; first global index 1" in fresh
    assert "progress: 0 positions of 9 read (0.0%): in epoch 1 of 2, 0 of its 4 records read" in fresh
    list(it)
    done = inspect_tool.describe_state(it.get_state())
    assert "main process: read 9 positions" in done
    assert "finished (the last of 2 epochs is read)" in done


def test_unknown_sampler_still_shows_positions():
    state = {
        "version": 2, "last_seen_indices": {"0": 4}, "last_worker_index": -1, "worker_count": 0,
        "sampler": "MySampler()", "data_source": "Mine()",
    }
    text = inspect_tool.describe_state(state)
    assert "sampler: MySampler()" in text and "epochs are not computed" in text
    assert "main process: read 5 positions, last at global index 4" in text


def test_orbax_checkpoint_directory_is_searched(tmp_path, capsys):
    it = iter(sharded_loader(workers=0))
    next(it)
    target = tmp_path / "ckpt" / "100" / "data_iter"
    target.mkdir(parents=True)
    (target / "process_0-of-1.json").write_bytes(it.get_state())
    assert inspect_tool.main([str(tmp_path / "ckpt")]) == 0
    out = capsys.readouterr().out
    assert f"Checkpoint state {target / 'process_0-of-1.json'}" in out
    assert "main process: read 2 positions" in out


def test_array_record_file_summary_with_decoded_record(tmp_path, image_dir, capsys):
    prefix = str(tmp_path / "pets")
    convert.convert_image_folder(image_dir, prefix, num_shards=2, include_paths=True, progress=False)
    second = f"{prefix}-00001-of-00002.array_record"
    assert inspect_tool.main([second, "--record", "1"]) == 0
    out = capsys.readouterr().out
    for line in [
        f"ArrayRecord file {second}",
        "records: 5",
        "group_size:1",
        f"written by grainlike-convert (grainlike-record-v1): {prefix}.json, 9 records in 2 shard(s)",
        "classes (label = index): cat, dog",
        "record 1: ",
        "image: ",
        "(PNG image)",
        "label: array int64 shape () = 1",
        "path: str of 11 bytes = 'dog/000.png'",
    ]:
        assert line in out, f"missing {line!r} in:\n{out}"


def test_runs_as_module(tmp_path, image_dir):
    prefix = str(tmp_path / "pets")
    convert.convert_image_folder(image_dir, prefix, progress=False)
    result = subprocess.run(
        [sys.executable, "-m", "grainlike.tools.inspect_cli", f"{prefix}-00000-of-00001.array_record"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "records: 9" in result.stdout and "label: array int64 shape () = 0" in result.stdout


def test_a_script_run_from_the_tools_folder_gets_the_standard_librarys_inspect():
    # Python puts a script's folder first on sys.path: a tools/inspect.py would be
    # imported as the standard library's inspect there, by the script and by
    # everything it imports.
    tools = os.path.join(ROOT, "grainlike", "tools")
    code = (
        f"import sys; sys.path.insert(0, {tools!r}); import inspect; "
        "print(inspect.__file__); assert callable(inspect.signature)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert not result.stdout.startswith(tools), result.stdout


def test_the_modules_old_name_still_imports():
    from grainlike.tools import inspect as old_name

    assert old_name is inspect_tool


def test_errors_name_the_file(tmp_path, capsys):
    (tmp_path / "notes.json").write_text('{"hello": 1}')
    (tmp_path / "data.bin").write_bytes(b"\0" * 100)
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    paths = [tmp_path / "notes.json", tmp_path / "data.bin", empty, tmp_path / "missing"]
    assert inspect_tool.main([str(p) for p in paths]) == 1
    err = capsys.readouterr().err
    assert f"{paths[0]}: not a DataLoader checkpoint state: keys ['last_seen_indices'" in err
    assert f"{paths[1]}: neither a checkpoint state (JSON) nor an ArrayRecord file" in err
    assert f"{paths[2]}: no checkpoint state found" in err
    assert f"{paths[3]}: no such file or directory" in err


def test_record_out_of_range(tmp_path, image_dir, capsys):
    prefix = str(tmp_path / "pets")
    convert.convert_image_folder(image_dir, prefix, progress=False)
    assert inspect_tool.main([f"{prefix}-00000-of-00001.array_record", "-r", "9"]) == 1
    assert "record 9 is out of range; the file has 9 records" in capsys.readouterr().err
