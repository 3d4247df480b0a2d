"""TFDS sources through grainlike: a tiny dataset built here, without TensorFlow.

The dataset is built by a ``GeneratorBasedBuilder`` defined in this file, stored as
ArrayRecord in 3 shards per split. Images are given to TFDS as PNG bytes: encoding
a numpy image needs TensorFlow (``tf.image.encode_png``), passing bytes does not,
and decoding uses OpenCV / PIL. The builder lives in a package (``tests``), where
TFDS imports ``importlib_resources`` to find its checksums: the ``tfds`` extra
installs it.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

import grainlike

tfds = pytest.importorskip("tensorflow_datasets")
pytest.importorskip("cv2")

from grainlike.sources.tfds import TfdsDataSource, from_tfds, is_tfds_source, tfds_source  # noqa: E402
from tests.helpers.leaks import LeakCheck  # noqa: E402

NAME = "tiny_images"
TRAIN, TEST = 20, 7
IMAGE_SHAPE = (8, 6, 3)


def png_bytes(value: int) -> bytes:
    """An 8x6 RGB PNG whose pixels are (value, 2 * value, 255 - value)."""
    import cv2

    bgr = np.ascontiguousarray(expected_image(value)[..., ::-1])  # OpenCV writes BGR
    ok, encoded = cv2.imencode(".png", bgr)
    assert ok
    return encoded.tobytes()


def expected_image(value: int) -> np.ndarray:
    pixel = np.array([value, 2 * value % 256, 255 - value], np.uint8)
    return np.broadcast_to(pixel, IMAGE_SHAPE)


def build_tiny_images(data_dir: str, num_shards: int = 3) -> None:
    """Writes dataset ``tiny_images`` (train: 20, test: 7) into ``data_dir``."""

    # skip_registration: the class may be defined once per test module without
    # clashing in TFDS's registry; tfds.data_source finds the dataset on disk.
    class TinyImages(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict(
                    {
                        "image": tfds.features.Image(shape=IMAGE_SHAPE),
                        "label": tfds.features.ClassLabel(num_classes=3),
                        "id": np.int64,
                    }
                ),
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(0, TRAIN), "test": self._generate_examples(100, TEST)}

        def _generate_examples(self, first, n):
            for i in range(first, first + n):
                yield i, {"image": png_bytes(i), "label": i % 3, "id": i}

    assert TinyImages.name == NAME
    tfds.disable_progress_bar()
    builder = TinyImages(data_dir=data_dir, file_format="array_record")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=num_shards))


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("tfds"))
    build_tiny_images(data_dir)
    return data_dir


def loader(source, *, workers=0, shuffle=False, epochs=1, seed=3, batch=4, shard=None):
    shard_options = grainlike.NoSharding() if shard is None else grainlike.ShardOptions(*shard)
    return grainlike.DataLoader(
        data_source=source,
        sampler=grainlike.IndexSampler(len(source), shard_options, shuffle=shuffle, num_epochs=epochs, seed=seed),
        operations=[grainlike.Batch(batch)] if batch else [],
        worker_count=workers,
        shard_options=shard_options,
    )


def ids(batches) -> list:
    return [b["id"].tolist() for b in batches]


# -- the source ------------------------------------------------------------------


def test_dataset_is_sharded_array_record(tfds_dir):
    source = tfds_source(NAME, "train", data_dir=tfds_dir)
    assert len(source.paths) == 3
    assert all(".array_record-" in p for p in source.paths)


@pytest.mark.parametrize("split", ["train", "test", "train[:45%]", "train[5:17]", "train[25%:]+test"])
def test_tfds_source_has_tfds_records_len_and_repr(tfds_dir, split):
    raw = tfds.data_source(NAME, split=split, data_dir=tfds_dir)
    source = tfds_source(NAME, split, data_dir=tfds_dir)
    assert isinstance(source, TfdsDataSource)
    assert repr(source) == repr(raw) == f"ArrayRecordDataSource(name={NAME}, split={split!r}, decoders=None)"
    assert len(source) == len(raw)
    keys = list(range(len(raw)))
    for mine, theirs in zip(source.__getitems__(keys[::-1] + [0, 0]), [raw[k] for k in keys[::-1] + [0, 0]]):
        assert mine.keys() == theirs.keys()
        for field in mine:
            np.testing.assert_array_equal(mine[field], theirs[field])
    record = source[0]
    assert record["image"].shape == IMAGE_SHAPE and record["image"].dtype == np.uint8
    np.testing.assert_array_equal(record["image"], expected_image(int(record["id"])))
    assert int(record["label"]) == int(record["id"]) % 3


def test_decoders_enter_repr_and_skip_decoding_gives_bytes(tfds_dir):
    decoders = {"image": tfds.decode.SkipDecoding()}
    raw = tfds.data_source(NAME, split="train", data_dir=tfds_dir, decoders=decoders)
    source = tfds_source(NAME, "train", data_dir=tfds_dir, decoders=decoders)
    assert repr(source) == repr(raw)
    assert "SkipDecoding" in repr(source)
    image = source[4]["image"]
    assert isinstance(image, bytes) and image == png_bytes(int(source[4]["id"]))


def test_raw_bytes_deserialize_method(tfds_dir):
    method = tfds.decode.DeserializeMethod.RAW_BYTES
    raw = tfds.data_source(NAME, split="test", data_dir=tfds_dir, deserialize_method=method)
    source = tfds_source(NAME, "test", data_dir=tfds_dir, deserialize_method=method)
    assert source.__getitems__([2, 0]) == [raw[2], raw[0]]


def test_pickles_without_readers_and_reads_after(tfds_dir):
    source = tfds_source(NAME, "train", data_dir=tfds_dir)
    first = source[7]  # opens a reader, which must not travel
    copy = pickle.loads(pickle.dumps(source))
    assert repr(copy) == repr(source)
    assert int(copy[7]["id"]) == int(first["id"])
    source.close()
    assert int(source[7]["id"]) == int(first["id"])  # reopens


def test_split_none_gives_one_source_per_split(tfds_dir):
    sources = tfds_source(NAME, None, data_dir=tfds_dir)
    assert sorted(sources) == ["test", "train"]
    assert [len(sources["train"]), len(sources["test"])] == [TRAIN, TEST]
    assert all(isinstance(s, TfdsDataSource) for s in sources.values())


def test_from_tfds_and_detection(tfds_dir):
    raw = tfds.data_source(NAME, split="train", data_dir=tfds_dir)
    assert is_tfds_source(raw) and not is_tfds_source([1, 2])
    assert isinstance(from_tfds(raw), TfdsDataSource)
    other = grainlike.RangeDataSource(0, 5, 1)
    assert from_tfds(other) is other


@pytest.mark.parametrize("wrap", [False, True])
def test_local_tfds_splits_are_read_in_the_calling_thread_by_default(tfds_dir, wrap):
    import threading

    from grainlike.sources.waiting import source_waits

    raw = tfds.data_source(NAME, split="train", data_dir=tfds_dir)
    source = from_tfds(raw) if wrap else raw
    assert source_waits(source) is False
    assert grainlike.MapDataset.source(source).to_iter_dataset().read_threads() == 0
    from tests.helpers.threads import new_read_threads, read_threads

    before = read_threads()
    for _ in loader(source):
        assert not new_read_threads(before)


def test_rejects_what_is_not_one_tfds_array_record_split(tfds_dir):
    with pytest.raises(TypeError, match="one split; got a dict of splits"):
        TfdsDataSource(tfds.data_source(NAME, split=None, data_dir=tfds_dir))
    with pytest.raises(TypeError, match="needs a TFDS ArrayRecord source.*RangeDataSource"):
        TfdsDataSource(grainlike.RangeDataSource(0, 5, 1))


def test_decode_error_names_key_split_and_file(tfds_dir, monkeypatch):
    source = tfds_source(NAME, "train[10:]", data_dir=tfds_dir)

    def broken(record, decoders=None):
        raise ValueError("corrupt example")

    monkeypatch.setattr(source.features, "deserialize_example_np", broken)
    with pytest.raises(ValueError, match="corrupt example") as info:
        source.__getitems__([0, 3])
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "record_key 0" in notes and "split='train[10:]'" in notes
    # Key 0 of train[10:] is record 10 of the split: record 3 of the second of 3 files (7+7+6).
    assert "record 3 of file" in notes and "00001-of-00003" in notes


# -- through the loader ---------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "workers, wrap",
    # tfds_source with workers: in the restore test (each worker start imports
    # TFDS, ~1.5 s, so worker runs are kept few).
    [(0, False), (0, True), (2, False)],
    ids=["W0-tfds.data_source", "W0-tfds_source", "W2-tfds.data_source"],
)
def test_loader_reads_every_record_in_key_order(tfds_dir, workers, wrap):
    raw = tfds.data_source(NAME, split="train", data_dir=tfds_dir)
    source = tfds_source(NAME, "train", data_dir=tfds_dir) if wrap else raw
    check = LeakCheck()
    it = iter(loader(source, workers=workers, batch=4))
    batches = list(it)
    state = json.loads(it.get_state())
    it.close()
    check.assert_clean()
    flat = sum(ids(batches), [])
    assert sorted(flat) == list(range(TRAIN))
    if workers == 0:  # one reader: batches follow key order
        assert flat == [int(raw[k]["id"]) for k in range(TRAIN)]
    assert all(b["image"].shape == (len(b["id"]), *IMAGE_SHAPE) and len(b["id"]) <= 4 for b in batches)
    assert state["data_source"] == repr(raw)
    assert state["worker_count"] == workers


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_restore_mid_epoch_continues_identically(tfds_dir, workers):
    source = tfds_source(NAME, "train", data_dir=tfds_dir)
    dl = loader(source, workers=workers, shuffle=True, epochs=2, batch=3, shard=(1, 2, False))
    it = iter(dl)
    head = [next(it)["id"].tolist() for _ in range(2)]  # 6 of the epoch's 10
    state = it.get_state()
    full = head + ids(it)  # taking the state does not disturb the run
    it.close()
    assert sorted(sum(full, [])) == sorted(2 * [int(source[k]["id"]) for k in range(TRAIN // 2, TRAIN)])
    # A loader over the raw TFDS source has the same name, so the state fits it.
    raw = tfds.data_source(NAME, split="train", data_dir=tfds_dir)
    # (With workers, only the raw source: each worker start imports TFDS, ~1.5 s.)
    for restored_source in (source, raw) if workers == 0 else (raw,):
        it = iter(loader(restored_source, workers=workers, shuffle=True, epochs=2, batch=3, shard=(1, 2, False)))
        it.set_state(state)
        assert ids(it) == full[2:]
        it.close()


def test_state_of_another_split_is_refused(tfds_dir):
    it = iter(loader(tfds_source(NAME, "train[:10]", data_dir=tfds_dir), batch=2))
    next(it)
    state = it.get_state()
    other = iter(loader(tfds_source(NAME, "train[10:]", data_dir=tfds_dir), batch=2))
    with pytest.raises(ValueError, match="split='train\\[:10\\]'"):
        other.set_state(state)
