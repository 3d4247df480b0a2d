"""grainlike-convert and the record format it writes (grainlike.formats)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import grainlike
from grainlike.formats import DecodeRecord, RecordFormatError, decode_record, encode_record, list_shards
from grainlike.tools import convert
from tests.tools.conftest import CLASSES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read_all(prefix: str) -> list:
    source = grainlike.ArrayRecordDataSource(list_shards(prefix))
    return [decode_record(r) for r in source.__getitems__(range(len(source)))]


# -- the record format --------------------------------------------------------------


def test_record_round_trip_keeps_dtypes_shapes_nesting_and_bytes():
    value = {
        "image": b"\x89PNG\r\n\x1a\n-rest",
        "label": 3,
        "score": 0.5,
        "ok": True,
        "caption": "un chat",
        "boxes": {"xy": np.arange(8, dtype=">i4").reshape(2, 4), "mask": np.eye(2, dtype=bool)},
        "empty": np.zeros((0, 3), np.float16),
    }
    out = decode_record(encode_record(value))
    assert out.keys() == value.keys() and out["boxes"].keys() == {"xy", "mask"}
    assert out["image"] == value["image"] and out["caption"] == "un chat"
    assert out["label"] == 3 and out["label"].dtype == np.int64
    assert out["score"] == 0.5 and out["ok"] is np.True_
    for got, want in [(out["boxes"]["xy"], value["boxes"]["xy"]), (out["boxes"]["mask"], value["boxes"]["mask"]), (out["empty"], value["empty"])]:
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert out["boxes"]["xy"].flags.writeable
    assert not decode_record(encode_record(value), copy=False)["boxes"]["xy"].flags.writeable


def test_bare_values_round_trip():
    np.testing.assert_array_equal(decode_record(encode_record(np.arange(5.0))), np.arange(5.0))
    assert decode_record(encode_record(b"raw")) == b"raw"


@pytest.mark.parametrize(
    "value, message",
    [
        ({"a": None}, "field 'a' has type NoneType"),
        ({"a": {"b": ["x", "y"]}}, "field 'a/b' has type list"),
        ({"a/b": 1}, "field name 'a/b' must be non-empty and not contain '/'"),
        ({1: 2}, "field names must be str, got 1"),
        ({}, "empty dict"),
    ],
)
def test_unstorable_values_are_named(value, message):
    with pytest.raises(RecordFormatError, match=message.replace("(", r"\(")):
        encode_record(value)


def test_foreign_and_truncated_records_are_refused():
    with pytest.raises(RecordFormatError, match="not a grainlike record: it starts with b'hello'"):
        decode_record(b"hello")
    record = encode_record({"x": np.arange(4)})
    with pytest.raises(RecordFormatError, match="truncated: field 'x'"):
        decode_record(record[:-1])


# -- images ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_image_folder_to_two_shards_reads_back_through_vision_and_batch(tmp_path, image_dir, workers):
    from grainlike import vision

    prefix = str(tmp_path / "out" / "pets")
    assert convert.main(["images", str(image_dir), "-o", prefix, "--shards", "2", "--quiet"]) == 0
    shards = list_shards(prefix)
    assert [os.path.basename(p) for p in shards] == ["pets-00000-of-00002.array_record", "pets-00001-of-00002.array_record"]
    info = json.loads(open(prefix + ".json").read())
    assert info["classes"] == ["cat", "dog"] and info["num_records"] == 9 and info["records_per_shard"] == [4, 5]

    source = grainlike.ArrayRecordDataSource(shards)
    loader = grainlike.DataLoader(
        data_source=source,
        sampler=grainlike.IndexSampler(len(source), grainlike.NoSharding(), shuffle=False, num_epochs=1, seed=0),
        operations=[
            DecodeRecord(),
            vision.Decode(key="image"),
            vision.Resize((8, 6), key="image"),
            vision.Normalize(127.5, 127.5, key="image"),
            grainlike.Batch(4),
        ],
        worker_count=workers,
    )
    batches = list(loader)
    assert sum(len(b["label"]) for b in batches) == 9
    for b in batches:
        assert b.keys() == {"image", "label"}
        assert b["image"].shape == (len(b["label"]), 8, 6, 3) and b["image"].dtype == np.float32
    labels = np.concatenate([b["label"] for b in batches])
    assert sorted(labels.tolist()) == [0] * 5 + [1] * 4
    if workers == 0:
        assert labels.tolist() == [0] * 5 + [1] * 4  # class by class, in file order
        first_dog = np.concatenate([b["image"] for b in batches])[5]
        np.testing.assert_allclose(first_dog, (0 - 127.5) / 127.5)  # dog/000.png is all 0


def test_with_paths_adds_relative_paths(tmp_path, image_dir):
    prefix = str(tmp_path / "pets")
    convert.convert_image_folder(image_dir, prefix, include_paths=True, progress=False)
    paths = [r["path"] for r in read_all(prefix)]
    assert paths == [f"{c}/{i:03d}.png" for c, sizes in CLASSES.items() for i in range(len(sizes))]


def test_runs_as_module_with_progress_on_stderr(tmp_path, image_dir):
    prefix = str(tmp_path / "pets")
    result = subprocess.run(
        [sys.executable, "-m", "grainlike.tools.convert", "images", str(image_dir), "-o", prefix, "-n", "3"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "wrote 9 records to 3 file(s)" in result.stdout
    assert "pets" in result.stderr and "9/9" in result.stderr  # tqdm or the plain counter
    assert len(list_shards(prefix)) == 3


def test_plain_counter_without_tqdm(tmp_path, image_dir, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
    assert convert.main(["images", str(image_dir), "-o", str(tmp_path / "pets")]) == 0
    assert "writing pets: 9/9 records" in capsys.readouterr().err


def test_refuses_to_overwrite_unless_asked(tmp_path, image_dir, capsys):
    prefix = str(tmp_path / "pets")
    assert convert.main(["images", str(image_dir), "-o", prefix, "-n", "2", "-q"]) == 0
    assert convert.main(["images", str(image_dir), "-o", prefix, "-n", "3", "-q"]) == 1
    assert "already exist" in capsys.readouterr().err
    assert convert.main(["images", str(image_dir), "-o", prefix, "-n", "3", "-q", "--overwrite"]) == 0
    assert len(list_shards(prefix)) == 3  # the 2 old shards are gone


def test_a_file_that_is_not_an_image_is_named(tmp_path, image_dir):
    (image_dir / "cat" / "broken.png").write_bytes(b"definitely not a png")
    with pytest.raises(ValueError, match="broken.png' is not an image"):
        convert.convert_image_folder(image_dir, str(tmp_path / "pets"), progress=False)
    assert not list(tmp_path.glob("pets*"))  # no shard, temporary file or metadata left


def test_folder_without_class_folders_is_refused(tmp_path):
    (tmp_path / "flat").mkdir()
    with pytest.raises(FileNotFoundError, match="no images in class sub-folders"):
        convert.convert_image_folder(tmp_path / "flat", str(tmp_path / "x"), progress=False)


# -- arrays and sources --------------------------------------------------------------------


def test_npz_and_npy_round_trip(tmp_path, capsys):
    rng = np.random.default_rng(0)
    arrays = {
        "x": rng.normal(size=(10, 3, 2)).astype(np.float32),
        "y": np.arange(10, dtype=np.int64),
        "mask": rng.random((10, 4)) > 0.5,
    }
    np.savez(tmp_path / "data.npz", **arrays)
    weights = np.linspace(0, 1, 10).astype(np.float16)
    np.save(tmp_path / "weights.npy", weights)
    prefix = str(tmp_path / "arr")
    argv = ["arrays", str(tmp_path / "data.npz"), str(tmp_path / "weights.npy"), "-o", prefix, "-n", "3", "-q"]
    assert convert.main(argv) == 0
    assert "wrote 10 records to 3 file(s)" in capsys.readouterr().out
    records = read_all(prefix)
    assert len(records) == 10
    for i, r in enumerate(records):
        assert r.keys() == {"x", "y", "mask", "weights"}
        for key, full in [*arrays.items(), ("weights", weights)]:
            assert np.asarray(r[key]).dtype == full.dtype
            np.testing.assert_array_equal(r[key], full[i])


def test_arrays_of_different_lengths_are_named(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.zeros(5))
    np.save(tmp_path / "b.npy", np.zeros(6))
    assert convert.main(["arrays", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "-o", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "same number of rows" in err and "a: 5" in err and "b: 6" in err


SMALL_SOURCE = [{"x": np.full(2, i), "name": f"r{i}"} for i in range(7)]


def test_any_source_from_python_and_command_line(tmp_path):
    prefix = str(tmp_path / "py")
    source = grainlike.InMemoryDataSource({"x": np.arange(14).reshape(7, 2), "y": np.arange(7)})
    try:
        convert.convert_source(source, prefix, num_shards=2, progress=False)
    finally:
        getattr(source, "close", lambda: None)()
    assert [int(r["y"]) for r in read_all(prefix)] == list(range(7))
    assert json.loads(open(prefix + ".json").read())["source"].startswith("SharedMemoryDataSource(")
    prefix = str(tmp_path / "cli")
    assert convert.main(["source", "tests.tools.test_convert:SMALL_SOURCE", "-o", prefix, "-q"]) == 0
    assert [int(r["x"][0]) for r in read_all(prefix)] == list(range(7))


def test_more_shards_than_records_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"num_shards must be in \[1, 7\]"):
        convert.convert_source(SMALL_SOURCE, str(tmp_path / "o"), num_shards=8, progress=False)


def test_unencodable_record_is_named_and_leaves_no_files(tmp_path):
    bad = SMALL_SOURCE[:3] + [{"x": None}]
    with pytest.raises(RecordFormatError) as info:
        convert.convert_source(bad, str(tmp_path / "o"), progress=False)
    assert "while encoding record 3" in "\n".join(getattr(info.value, "__notes__", []))
    assert os.listdir(tmp_path) == []


def test_tfds_split_keeps_images_encoded(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    from tests.test_tfds import NAME, build_tiny_images

    data_dir = str(tmp_path / "tfds")
    build_tiny_images(data_dir, num_shards=1)
    prefix = str(tmp_path / "tiny")
    argv = ["tfds", NAME, "--split", "test", "--data-dir", data_dir, "-o", prefix, "-n", "2", "-q"]
    assert convert.main(argv) == 0
    reference = tfds.data_source(NAME, split="test", data_dir=data_dir)
    from grainlike.vision import Decode

    records = read_all(prefix)
    assert len(records) == len(reference)
    for got, want in zip(records, (reference[k] for k in range(len(reference)))):
        assert isinstance(got["image"], bytes)
        np.testing.assert_array_equal(Decode().map(got["image"]), want["image"])
        assert got["id"] == want["id"] and got["label"] == want["label"]
    info = json.loads(open(prefix + ".json").read())
    assert info["tfds"] == {"name": NAME, "split": "test", "images_encoded": True}


@pytest.mark.parametrize("kind", ["images", "arrays"])
def test_the_read_with_lines_run_as_printed(tmp_path, image_dir, capsys, kind):
    """The snippet convert prints after writing runs as printed."""
    prefix = str(tmp_path / "out")
    if kind == "images":
        argv, count = ["images", str(image_dir)], 9  # the folder's 9 images
    else:
        np.save(tmp_path / "x.npy", np.arange(12).reshape(6, 2))
        argv, count = ["arrays", str(tmp_path / "x.npy")], 6  # one record per row
    assert convert.main([*argv, "-o", prefix, "-n", "2", "-q"]) == 0
    out = capsys.readouterr().out
    code = textwrap.dedent(out[out.index("read with:\n") + len("read with:\n"):])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{count} {{")  # the first record decoded to its fields
