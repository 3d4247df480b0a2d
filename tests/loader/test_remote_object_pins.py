"""The DataLoader's state names the versions of the remote objects it reads.

Real parts only: moto's S3 server and the GCS emulator on localhost (reads go
through fsspec + s3fs / gcsfs). A state saved on one version of an object and
restored after the object was overwritten reads the saved version where the
store keeps it, and is refused naming the object otherwise; an object
overwritten during an epoch raises, with and without workers, and no batch
mixes rows of two versions. Local sources' states stay grain's, byte for byte
(tests/compat/test_data_loader_compat.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import grainlike as grain
from grainlike.core.errors import InvalidStateError
from grainlike.sources.formats import remote_files as remote
from grainlike.sources.formats import remote_pins
from grainlike.sources.parquet import ParquetDataSource

pytest.importorskip("s3fs")
pytest.importorskip("moto")
pytest.importorskip("pyarrow.parquet")

from tests.sources.s3_server import serving  # noqa: E402
from tests.helpers.array_record_files import write_array_record  # noqa: E402

BUCKET = "grainlike-loader-pins"
ROWS = 400
NEW_FIRST_ID = 100_000  # Rows of the overwriting version: ids from here.


def _write_parquet(path: str, first_id: int, rows: int = ROWS) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": np.arange(first_id, first_id + rows, dtype=np.int64)}), path, row_group_size=50)
    return path


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("pins-src")
    return {"old": _write_parquet(str(d / "old.parquet"), 0), "new": _write_parquet(str(d / "new.parquet"), NEW_FIRST_ID)}


@pytest.fixture(scope="module")
def s3():
    with serving(BUCKET, {}) as running:
        yield running


def _options(server) -> remote.RemoteOptions:
    return remote.RemoteOptions(storage_options=server.storage_options(), attempts=2, backoff_s=0.01)


def _loader(source, worker_count: int = 0, batch: int = 10):
    sampler = grain.IndexSampler(len(source), grain.NoSharding(), shuffle=True, num_epochs=1, seed=3)
    return grain.DataLoader(
        data_source=source, sampler=sampler, operations=[grain.Batch(batch)], worker_count=worker_count,
    )


def _ids(batches) -> list:
    return [int(i) for b in batches for i in b["id"]]


def _put(s3, bucket: str, key: str, path: str) -> str:
    s3.client().upload_file(path, bucket, key)
    return f"s3://{bucket}/{key}"


def _bucket(s3, name: str, versioning: bool) -> str:
    client = s3.client()
    client.create_bucket(Bucket=name)
    if versioning:
        client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return name


def _expected(old_path: str, worker_count: int = 0) -> list:
    """All ids of the old version, in the loader's order (the same loader over a local copy)."""
    return _ids(_loader(ParquetDataSource(old_path), worker_count))


def test_a_remote_sources_loader_state_names_each_objects_version_and_otherwise_is_grains(s3, versions):
    url = _put(s3, BUCKET, "named.parquet", versions["old"])
    options = _options(s3)
    it = iter(_loader(ParquetDataSource(url, remote_options=options)))
    next(it), next(it)
    state = json.loads(it.get_state())
    pin = remote.object_info(url, options)
    assert state["remote_objects"] == {url: remote_pins.pin_state(pin)}
    assert state["remote_objects"][url]["etag"] == pin["etag"]
    # Beside the pins, the state is the one a local copy of the data gives.
    local = iter(_loader(ParquetDataSource(versions["old"])))
    next(local), next(local)
    del state["remote_objects"]
    assert {k: v for k, v in state.items() if k != "data_source"} == {
        k: v for k, v in json.loads(local.get_state()).items() if k != "data_source"
    }


@pytest.mark.parametrize("worker_count", [0, 2])
def test_a_restore_onto_an_overwritten_object_is_refused_naming_it_and_both_versions(s3, versions, worker_count):
    key = f"overwritten-{worker_count}.parquet"
    url = _put(s3, BUCKET, key, versions["old"])
    options = _options(s3)
    old = remote.object_info(url, options)
    it = iter(_loader(ParquetDataSource(url, remote_options=options), worker_count))
    first = [next(it) for _ in range(3)]
    saved = it.get_state()
    it.close()
    # Restored onto the same object, the rest of the epoch follows.
    again = iter(_loader(ParquetDataSource(url, remote_options=options), worker_count))
    again.set_state(saved)
    expected = _expected(versions["old"], worker_count)
    assert _ids(first) + _ids(again) == expected
    _put(s3, BUCKET, key, versions["new"])  # A bucket without versioning keeps no old version.
    new = remote.object_info(url, options)
    assert new["etag"] != old["etag"]
    restored = iter(_loader(ParquetDataSource(url, remote_options=options), worker_count))
    with pytest.raises(remote.ObjectChangedError) as e:
        restored.set_state(saved)
    message = str(e.value)
    assert key in message and old["version"] in message and new["version"] in message
    assert "state being restored" in "".join(e.value.__notes__)
    # The refused state changed nothing: the iterator starts the new version's epoch.
    assert _ids(restored) == [i + NEW_FIRST_ID for i in expected]
    # grain's state (no versions) restores onto the objects as they are, as grain would.
    plain = json.loads(saved)
    del plain["remote_objects"]
    as_grain = iter(_loader(ParquetDataSource(url, remote_options=options), worker_count))
    as_grain.set_state(json.dumps(plain, indent=4).encode())
    assert _ids(as_grain) == [i + NEW_FIRST_ID for i in expected[30:]]


@pytest.mark.parametrize("worker_count", [0, 2])
def test_a_restore_reads_the_saved_version_where_the_bucket_keeps_versions(s3, versions, worker_count):
    bucket = _bucket(s3, f"grainlike-loader-versioned-{worker_count}", versioning=True)
    url = _put(s3, bucket, "data.parquet", versions["old"])
    options = _options(s3)
    it = iter(_loader(ParquetDataSource(url, remote_options=options), worker_count))
    first = [next(it) for _ in range(3)]
    saved = it.get_state()
    assert json.loads(saved)["remote_objects"][url].get("version_id")
    it.close()
    _put(s3, bucket, "data.parquet", versions["new"])
    restored = iter(_loader(ParquetDataSource(url, remote_options=options), worker_count))
    restored.set_state(saved)
    rest = [next(restored) for _ in range(2)]
    # The state taken now still names the saved version, and restores again.
    again = restored.get_state()
    assert json.loads(again)["remote_objects"] == json.loads(saved)["remote_objects"]
    rest += list(restored)
    assert _ids(first) + _ids(rest) == _expected(versions["old"], worker_count)


def test_a_state_naming_other_objects_is_refused_before_anything_changes(s3, versions):
    url = _put(s3, BUCKET, "other.parquet", versions["old"])
    it = iter(_loader(ParquetDataSource(url, remote_options=_options(s3))))
    next(it)
    state = json.loads(it.get_state())
    state["remote_objects"] = {"s3://elsewhere/x.parquet": state["remote_objects"][url]}
    with pytest.raises(InvalidStateError, match=r"elsewhere/x\.parquet.*other\.parquet"):
        it.set_state(json.dumps(state).encode())
    assert _ids([next(it)]) == _expected(versions["old"])[10:20]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("worker_count", [0, 2])
def test_an_object_overwritten_mid_epoch_raises_and_no_batch_mixes_versions(s3, tmp_path, worker_count):
    key = f"mid-epoch-{worker_count}.parquet"
    # Many row groups, one decoded at a time: most of the epoch is read after the overwrite.
    old_path = _write_parquet(str(tmp_path / "old.parquet"), 0, rows=4000)
    url = _put(s3, BUCKET, key, old_path)
    options = remote.RemoteOptions(
        storage_options=s3.storage_options(), attempts=2, backoff_s=0.01, block_size=4096, read_ahead=0
    )
    source = ParquetDataSource(url, remote_options=options, cached_row_groups=1)
    sampler = grain.IndexSampler(len(source), grain.NoSharding(), shuffle=False, num_epochs=1, seed=0)
    loader = grain.DataLoader(
        data_source=source, sampler=sampler, operations=[grain.Batch(10)], worker_count=worker_count,
        read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=1),
    )
    delivered = []
    with iter(loader) as it:
        delivered.append(next(it))
        _put(s3, BUCKET, key, _write_parquet(str(tmp_path / "new.parquet"), NEW_FIRST_ID, rows=4000))
        with pytest.raises(remote.ObjectChangedError, match=key):
            for batch in it:
                delivered.append(batch)
    ids = _ids(delivered)
    assert ids and all(i < NEW_FIRST_ID for i in ids)
    assert len(ids) < 4000


def test_grain_and_grainlike_restore_each_others_states_of_a_remote_source(s3, versions):
    reference = pytest.importorskip("grain.python")
    url = _put(s3, BUCKET, "cross.parquet", versions["old"])
    options = _options(s3)

    def grain_loader():
        source = ParquetDataSource(url, remote_options=options)
        sampler = reference.IndexSampler(len(source), reference.NoSharding(), shuffle=True, num_epochs=1, seed=3)
        return reference.DataLoader(data_source=source, sampler=sampler, operations=[reference.Batch(10)])

    expected = _expected(versions["old"])
    theirs = iter(grain_loader())
    next(theirs), next(theirs)
    ours = iter(_loader(ParquetDataSource(url, remote_options=options)))
    next(ours), next(ours)
    ours_state = json.loads(ours.get_state())
    assert ours_state.pop("remote_objects")
    assert ours_state == json.loads(theirs.get_state())
    # grain's state restores in grainlike; grainlike's (with the versions) in grain.
    restored = iter(_loader(ParquetDataSource(url, remote_options=options)))
    restored.set_state(theirs.get_state())
    assert _ids(restored) == expected[20:]
    in_grain = iter(grain_loader())
    in_grain.set_state(ours.get_state())
    assert _ids(in_grain) == expected[20:]


def test_an_array_record_shard_overwritten_since_the_save_is_read_from_its_cached_copy_or_refused(s3, tmp_path):
    from grainlike.sources.array_record import ArrayRecordDataSource

    def shard(name: str, prefix: bytes) -> str:
        return write_array_record(tmp_path / name, [prefix + b"%03d" % i for i in range(20)])

    key = "shard.array_record"
    url = _put(s3, BUCKET, key, shard("old.array_record", b"old"))

    def loader(cache: str = "cache"):
        options = remote.RemoteOptions(
            storage_options=s3.storage_options(), cache_dir=str(tmp_path / cache), attempts=2, backoff_s=0.01
        )
        source = ArrayRecordDataSource(url, remote_options=options)
        sampler = grain.IndexSampler(len(source), grain.NoSharding(), shuffle=False, num_epochs=1, seed=0)
        return grain.DataLoader(data_source=source, sampler=sampler)

    it = iter(loader())
    assert [next(it) for _ in range(5)] == [b"old%03d" % i for i in range(5)]
    saved = it.get_state()
    assert url in json.loads(saved)["remote_objects"]
    again = iter(loader())
    again.set_state(saved)
    assert list(again) == [b"old%03d" % i for i in range(5, 20)]
    _put(s3, BUCKET, key, shard("new.array_record", b"new"))
    assert list(loader()) == [b"new%03d" % i for i in range(20)]
    # The cache still holds the saved version (checked by size and ETag): it is read.
    restored = iter(loader())
    restored.set_state(saved)
    assert list(restored) == [b"old%03d" % i for i in range(5, 20)]
    # Where no copy of it is left, the restore is refused naming the shard.
    uncached = iter(loader("empty-cache"))
    with pytest.raises(remote.ObjectChangedError, match=r"shard\.array_record"):
        uncached.set_state(saved)


def test_a_gcs_object_overwritten_since_the_save_is_refused_naming_both_generations(tmp_path, versions):
    pytest.importorskip("gcsfs")
    pytest.importorskip("gcp_storage_emulator")
    from tests.sources.gcs_server import LocalGcsServer

    server = LocalGcsServer()
    server.start()
    try:
        bucket = "grainlike-loader-pins-gcs"
        server.upload(bucket, {"data.parquet": versions["old"]})
        url = f"gs://{bucket}/data.parquet"
        options = _options(server)
        it = iter(_loader(ParquetDataSource(url, remote_options=options)))
        next(it)
        saved = it.get_state()
        old = json.loads(saved)["remote_objects"][url]["generation"]
        assert old == remote.object_info(url, options)["generation"]
        # The emulator keeps only the live generation (a bucket without object versioning).
        server.upload(bucket, {"data.parquet": versions["new"]})
        new = remote.object_info(url, options)["generation"]
        restored = iter(_loader(ParquetDataSource(url, remote_options=options)))
        with pytest.raises(remote.ObjectChangedError) as e:
            restored.set_state(saved)
        assert "data.parquet" in str(e.value) and old in str(e.value) and new in str(e.value)
    finally:
        server.stop()
