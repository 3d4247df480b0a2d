"""HuggingFaceDataSource over real ``datasets.Dataset`` objects, built offline from local files."""

from __future__ import annotations

import io
import os
import pickle

import cloudpickle
import numpy as np
import pytest

import grainlike as gl
from grainlike.dataset.conformance import assert_equal_output_after_checkpoint
from grainlike.sources.hf import HuggingFaceDataSource
from tests.compat.conftest import grain_ref  # noqa: F401 (the fixture)

datasets = pytest.importorskip("datasets")
Image = pytest.importorskip("PIL.Image")

N = 24


def _png(value: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((28, 28), value, np.uint8)).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def mnist_like(tmp_path_factory):
    """An MNIST-shaped dataset (28x28 PNG digits, labels) loaded from a local Parquet file."""
    d = tmp_path_factory.mktemp("hf")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
    built = datasets.Dataset.from_dict(
        {"image": [{"bytes": _png(i), "path": None} for i in range(N)], "label": [i % 10 for i in range(N)]},
        features=features,
    )
    built.to_parquet(str(d / "mnist.parquet"))
    return datasets.load_dataset(
        "parquet", data_files=str(d / "mnist.parquet"), split="train", cache_dir=str(d / "cache")
    ).cast(features)


def test_records_are_numpy_as_the_numpy_format_gives_them(mnist_like):
    source = HuggingFaceDataSource(mnist_like)
    assert len(source) == N
    record = source[13]
    assert set(record) == {"image", "label"}
    assert record["image"].dtype == np.uint8 and record["image"].shape == (28, 28)
    assert int(record["image"][0, 0]) == 13 and record["label"] == 3
    reference = mnist_like.with_format("numpy")
    for got, key in zip(source.__getitems__([5, 0, 5, 23]), [5, 0, 5, 23]):
        assert np.array_equal(got["image"], reference[key]["image"]) and got["label"] == reference[key]["label"]


def test_reads_local_arrow_in_the_calling_thread_by_default(mnist_like):
    import threading

    source = HuggingFaceDataSource(mnist_like)
    assert source.waits is False
    assert gl.MapDataset.source(source).to_iter_dataset().read_threads() == 0
    loader = gl.DataLoader(
        data_source=source, sampler=gl.IndexSampler(N, gl.NoSharding(), shuffle=True, num_epochs=1, seed=1),
        operations=[gl.Batch(4)],
    )
    from tests.helpers.threads import new_read_threads, read_threads

    before = read_threads()
    for _ in loader:
        assert not new_read_threads(before)


def test_a_batched_read_indexes_the_dataset_once(mnist_like, monkeypatch):
    source = HuggingFaceDataSource(mnist_like)
    view = source._view()
    calls = []
    original = type(view).__getitem__

    def counting(self, key):
        calls.append(key)
        return original(self, key)

    monkeypatch.setattr(type(view), "__getitem__", counting)
    source.__getitems__([3, 1, 4, 1, 5])
    assert calls == [[3, 1, 4, 1, 5]]


def test_columns_and_errors(mnist_like):
    assert list(HuggingFaceDataSource(mnist_like, columns=["label"])[2]) == ["label"]
    with pytest.raises(ValueError, match="'text'"):
        HuggingFaceDataSource(mnist_like, columns=["text"])
    with pytest.raises(TypeError, match="pick a split"):
        HuggingFaceDataSource(datasets.DatasetDict({"train": mnist_like}))
    with pytest.raises(IndexError, match=str(N)):
        HuggingFaceDataSource(mnist_like)[N]


def test_repr_is_the_fingerprint_and_stable(mnist_like):
    a, b = HuggingFaceDataSource(mnist_like), HuggingFaceDataSource(mnist_like)
    assert repr(a) == repr(b) == f"HuggingFaceDataSource(fingerprint={mnist_like._fingerprint}, len={N}, columns=None)"
    assert repr(HuggingFaceDataSource(mnist_like.shuffle(seed=0))) != repr(a)
    assert repr(pickle.loads(cloudpickle.dumps(a))) == repr(a)


def test_file_backed_dataset_pickles_as_file_names(mnist_like):
    source = HuggingFaceDataSource(mnist_like)
    table_bytes = mnist_like.data.nbytes
    assert len(cloudpickle.dumps(source)) < table_bytes / 2 or table_bytes < 4096
    assert source.dataset is mnist_like  # not copied to disk


def test_in_memory_dataset_is_spilled_once_for_workers(tmp_path):
    big = datasets.Dataset.from_dict({"x": np.arange(200_000, dtype=np.int64), "y": np.ones(200_000, np.float32)})
    source = HuggingFaceDataSource(big)
    before = repr(source)
    payload = cloudpickle.dumps(source)
    assert len(payload) < 100_000 < big.data.nbytes  # the table is not in the pickle
    spilled = os.path.dirname(source.dataset.cache_files[0]["filename"])
    assert spilled and os.path.isdir(spilled)
    clone = pickle.loads(payload)
    assert clone[123_456]["x"] == 123_456 and repr(clone) == repr(source) == before
    cloudpickle.dumps(source)
    assert os.path.dirname(source.dataset.cache_files[0]["filename"]) == spilled  # not written again
    source.close()
    assert not os.path.exists(spilled)


@pytest.mark.parametrize("workers", [0, 2])
def test_mnist_through_data_loader_with_workers_and_restore(mnist_like, workers, no_leaks):
    source = HuggingFaceDataSource(mnist_like)

    def loader():
        return gl.DataLoader(
            data_source=source,
            sampler=gl.IndexSampler(N, gl.NoSharding(), shuffle=True, num_epochs=1, seed=7),
            operations=[gl.Batch(4)],
            worker_count=workers,
        )

    it = iter(loader())
    first = next(it)
    assert first["image"].shape == (4, 28, 28) and first["label"].dtype == np.int64
    assert first["label"].tolist() == [v % 10 for v in first["image"][:, 0, 0].tolist()]
    state = it.get_state()
    rest = [b["image"][:, 0, 0].tolist() for b in it]
    assert sorted(first["image"][:, 0, 0].tolist() + sum(rest, [])) == list(range(N))  # each once
    again = iter(loader())
    again.set_state(state)
    assert [b["image"][:, 0, 0].tolist() for b in again] == rest


def test_mnist_through_map_dataset_checkpoint(mnist_like, no_leaks):
    ds = gl.MapDataset.source(HuggingFaceDataSource(mnist_like)).shuffle(seed=3).map(lambda r: int(r["label"]))
    assert sorted(ds) == sorted(i % 10 for i in range(N))
    assert_equal_output_after_checkpoint(ds.to_iter_dataset())
    pooled = ds.to_iter_dataset().mp_prefetch(gl.MultiprocessingOptions(num_workers=2))
    assert list(pooled) == list(ds)


def test_grain_data_loader_over_the_source_gives_the_same_batches_and_states(mnist_like, grain_ref):
    """grain's DataLoader takes any source: same batches, same state, restorable both ways."""

    def loader(lib):
        source = HuggingFaceDataSource(mnist_like)
        return lib.DataLoader(
            data_source=source,
            sampler=lib.IndexSampler(len(source), lib.NoSharding(), shuffle=True, num_epochs=1, seed=2),
            operations=[lib.Batch(5)],
            worker_count=0,
        )

    def plain(batches):
        return [(b["image"][:, 0, 0].tolist(), b["label"].tolist()) for b in batches]

    theirs, ours = iter(loader(grain_ref)), iter(loader(gl))
    assert plain(next(theirs) for _ in range(2)) == plain(next(ours) for _ in range(2))
    state_theirs, state_ours = theirs.get_state(), ours.get_state()
    assert state_ours == state_theirs and b"HuggingFaceDataSource(fingerprint=" in state_ours
    rest = plain(theirs)
    assert len(rest) == 3 and plain(ours) == rest  # 24 records in batches of 5: 5 batches
    mine, reference = iter(loader(gl)), iter(loader(grain_ref))
    mine.set_state(state_theirs)
    reference.set_state(state_ours)
    assert plain(mine) == plain(reference) == rest
