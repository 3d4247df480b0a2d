"""Remote files (s3://) against a real S3-compatible server started on localhost.

The server is moto's, in its own process group, ended by the fixture; reads go
through fsspec + s3fs (no mock of any client library). Credentials are dummy
keys given in the storage options; ~/.aws is never read.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import numpy as np
import pytest

import grainlike as gl
from grainlike.dataset.conformance import assert_equal_output_after_checkpoint
from grainlike.dataset.sources.parquet_iter_dataset import ParquetIterDataset
from grainlike.sources.formats import file_cache
from grainlike.sources.formats import remote_files as remote
from grainlike.sources.array_record import ArrayRecordDataSource, SourceFileNotFoundError
from grainlike.sources.parquet import ParquetDataSource

pytest.importorskip("s3fs")
pytest.importorskip("moto")
pytest.importorskip("pyarrow")
pytest.importorskip("pyarrow.parquet")
pytest.importorskip("array_record.python.array_record_module")

from tests.helpers import leaks  # noqa: E402
from tests.sources.corpus import write_corpus  # noqa: E402
from tests.sources.s3_server import TcpProxy, serving  # noqa: E402

BUCKET = "grainlike-data"
SHARDS = 2
PER_SHARD = 12
BIG = 1200


def _records(shard: int) -> list:
    return [f"shard{shard}-record{i:03d}".encode() for i in range(PER_SHARD)]


@pytest.fixture(scope="module")
def local_files(tmp_path_factory):
    """Two ArrayRecord shards and two Parquet files (row groups of 4 rows)."""
    return write_corpus(
        tmp_path_factory.mktemp("remote-src"), _records, SHARDS, BIG,
        lambda shard: f"train-{shard:05d}-of-{SHARDS:05d}.array_record",
    )


@pytest.fixture(scope="module")
def server(local_files):
    with serving(BUCKET, local_files) as running:
        yield running


@pytest.fixture
def up(server, local_files):
    """The server, running with the data (restarted if a test stopped it)."""
    if server.proc is None or server.proc.poll() is not None:
        server.start()
        server.upload(BUCKET, local_files)
    return server


@pytest.fixture
def no_worker_leaks():
    """No worker process, shared-memory segment or worker thread outlives the test.

    Unlike ``no_leaks``, descriptors are not compared: the process's S3
    filesystem keeps its connections and its event loop open for later reads.
    """
    children, shm = leaks.worker_children(), leaks.own_shm_entries()
    threads = {t for t in leaks.grainlike_threads() if not t.startswith("grainlike-remote")}
    yield
    assert leaks.wait_until(lambda: leaks.worker_children() <= children), leaks.worker_children() - children
    assert leaks.wait_until(lambda: leaks.own_shm_entries() <= shm), leaks.own_shm_entries() - shm
    # The read-ahead threads ("grainlike-remote") are one pool per process, kept for later reads.
    assert leaks.wait_until(
        lambda: {t for t in leaks.grainlike_threads() if not t.startswith("grainlike-remote")} <= threads
    )


def _options(server, tmp_path=None, **kwargs) -> remote.RemoteOptions:
    kwargs.setdefault("attempts", 2)
    kwargs.setdefault("backoff_s", 0.01)
    return remote.RemoteOptions(
        storage_options=server.storage_options(),
        cache_dir=None if tmp_path is None else str(tmp_path / "cache"),
        **kwargs,
    )


def _urls(kind: str) -> list:
    if kind == "ar":
        return [f"s3://{BUCKET}/ar/train-{s:05d}-of-{SHARDS:05d}.array_record" for s in range(SHARDS)]
    return [f"s3://{BUCKET}/pq/part-{s}.parquet" for s in range(SHARDS)]


def _local(local_files, kind: str) -> list:
    return [path for key, path in local_files.items() if key.startswith(kind + "/")]


def _loader(source, workers: int, batch: int = 4, **kwargs):
    return gl.DataLoader(
        data_source=source,
        sampler=gl.IndexSampler(len(source), gl.NoSharding(), shuffle=True, num_epochs=1, seed=5),
        operations=[gl.Batch(batch)],
        worker_count=workers,
        **kwargs,
    )


def _ids(batches) -> list:
    return [b.tolist() if isinstance(b, np.ndarray) else b["id"].tolist() for b in batches]


# -- ArrayRecord -----------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_array_record_shards_from_s3_through_data_loader_and_restore(up, local_files, tmp_path, workers, no_worker_leaks):
    source = ArrayRecordDataSource(_urls("ar"), remote_options=_options(up, tmp_path))
    local = ArrayRecordDataSource(_local(local_files, "ar"))
    assert len(source) == len(local) == SHARDS * PER_SHARD
    expected = [b.tolist() for b in _loader(local, workers)]
    it = iter(_loader(source, workers))
    head = [next(it).tolist() for _ in range(2)]
    state = it.get_state()
    tail = [b.tolist() for b in it]
    assert head + tail == expected
    again = iter(_loader(ArrayRecordDataSource(_urls("ar"), remote_options=_options(up, tmp_path)), workers))
    again.set_state(state)
    assert [b.tolist() for b in again] == tail


def test_array_record_from_s3_in_map_dataset_with_workers(up, local_files, tmp_path, no_worker_leaks):
    source = ArrayRecordDataSource(_urls("ar"), remote_options=_options(up, tmp_path))
    ds = gl.MapDataset.source(source).shuffle(seed=2).to_iter_dataset()
    expected = list(gl.MapDataset.source(ArrayRecordDataSource(_local(local_files, "ar"))).shuffle(seed=2))
    assert list(ds.mp_prefetch(gl.MultiprocessingOptions(num_workers=2))) == expected
    assert_equal_output_after_checkpoint(ds)


def test_array_record_remote_instructions_fetch_on_first_read(up, tmp_path):
    options = _options(up, tmp_path)
    source = ArrayRecordDataSource([u + f"[0:{PER_SHARD}]" for u in _urls("ar")], remote_options=options)
    assert not os.path.exists(tmp_path / "cache")  # nothing fetched to build it
    assert source[PER_SHARD + 1] == _records(1)[1]
    assert [n for n in os.listdir(tmp_path / "cache") if not n.startswith(".")]


def test_array_record_missing_or_broken_object_is_named(up, tmp_path):
    url = f"s3://{BUCKET}/ar/missing.array_record"
    with pytest.raises(SourceFileNotFoundError, match="missing.array_record"):
        ArrayRecordDataSource(url, remote_options=_options(up, tmp_path))
    junk = tmp_path / "junk.array_record"
    junk.write_bytes(b"not an array record file" * 100)
    up.upload(BUCKET, {"ar/junk.array_record": str(junk)})
    with pytest.raises(ValueError, match="junk.array_record"):
        ArrayRecordDataSource(f"s3://{BUCKET}/ar/junk.array_record", remote_options=_options(up, tmp_path))


def test_array_record_repr_hashes_urls_as_grain_hashes_paths(up, tmp_path):
    source = ArrayRecordDataSource(_urls("ar"), remote_options=_options(up, tmp_path))
    import hashlib

    h = hashlib.sha1()
    for url in _urls("ar"):
        h.update(url.encode())
    assert repr(source) == f"ArrayRecordDataSource(hash_of_paths={h.hexdigest()})"


# -- Parquet ----------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_parquet_from_s3_through_data_loader_and_restore(up, local_files, workers, no_worker_leaks):
    options = _options(up, block_size=512)
    source = ParquetDataSource(_urls("pq"), remote_options=options)
    expected = _ids(_loader(ParquetDataSource(_local(local_files, "pq")), workers))
    it = iter(_loader(source, workers))
    head = [next(it)["id"].tolist() for _ in range(2)]
    state = it.get_state()
    tail = _ids(it)
    assert head + tail == expected
    again = iter(_loader(ParquetDataSource(_urls("pq"), remote_options=options), workers))
    again.set_state(state)
    assert _ids(again) == tail


@pytest.mark.parametrize("workers", [0, 2])
def test_parquet_from_s3_in_map_dataset(up, local_files, workers, no_worker_leaks):
    def pipeline(paths, options=None):
        ds = gl.MapDataset.source(ParquetDataSource(paths, remote_options=options)).shuffle(seed=4)
        return ds.map(lambda r: int(r["id"])).to_iter_dataset()

    expected = list(pipeline(_local(local_files, "pq")))
    ds = pipeline(_urls("pq"), _options(up, block_size=512))
    assert list(ds.mp_prefetch(gl.MultiprocessingOptions(num_workers=workers))) == expected
    if workers == 0:
        assert_equal_output_after_checkpoint(ds)


def _read_threads_and_ids(loader) -> tuple[set, list]:
    from tests.helpers.threads import new_read_threads, read_threads

    seen, ids, before = set(), [], read_threads()
    for b in loader:
        seen |= new_read_threads(before)
        ids.extend(_ids([b]))
    return seen, ids


def test_remote_files_are_read_in_threads_by_default_and_local_files_are_not(up, local_files, tmp_path, no_worker_leaks):
    remote_sources = [
        ArrayRecordDataSource(_urls("ar"), remote_options=_options(up, tmp_path)),
        ParquetDataSource(_urls("pq"), remote_options=_options(up, block_size=512)),
    ]
    local_sources = [ArrayRecordDataSource(_local(local_files, "ar")), ParquetDataSource(_local(local_files, "pq"))]
    for remote_source, local_source in zip(remote_sources, local_sources):
        assert remote_source.waits is True and local_source.waits is False
        threads_remote, ids_remote = _read_threads_and_ids(_loader(remote_source, 0))
        threads_local, ids_local = _read_threads_and_ids(_loader(local_source, 0))
        assert threads_remote and not threads_local
        assert ids_remote == ids_local
        assert gl.MapDataset.source(remote_source).to_iter_dataset().read_threads() == 16
        assert gl.MapDataset.source(local_source).to_iter_dataset().read_threads() == 0


def test_parquet_iter_dataset_from_s3_equals_local(up, local_files):
    ours = ParquetIterDataset(_urls("pq"), remote_options=_options(up, block_size=256))
    local = ParquetIterDataset(_local(local_files, "pq"))
    assert [int(r["id"]) for r in ours] == [int(r["id"]) for r in local]
    it = iter(ParquetIterDataset(_urls("pq")[0], remote_options=_options(up)))
    next(it)
    state = it.get_state()
    # grain's keys, and the version read (a restore onto a changed object is refused).
    assert state.pop("object")["version"] == remote.object_info(_urls("pq")[0], _options(up))["version"]
    assert state == {"row_group": 0, "index_within_row_group": 1}


def test_parquet_through_local_cache_is_bounded(up, local_files, tmp_path):
    size = os.path.getsize(_local(local_files, "pq")[0])
    options = _options(up, tmp_path, cache_max_bytes=size + size // 2)  # room for one file
    source = ParquetDataSource(_urls("pq"), remote_options=options)
    assert [int(source[k]["id"]) for k in (0, PER_SHARD)] == [0, 100]
    cached = [n for n in os.listdir(tmp_path / "cache") if not n.startswith(".")]
    assert len(cached) == 1 and cached[0].endswith("part-1.parquet")


def test_a_pinned_copy_is_not_evicted_until_released(up, local_files, tmp_path):
    # Readers open a cached copy after fetching it; another reader's fetch in
    # between must not remove it (ParquetDataSource opens its files in threads).
    size = os.path.getsize(_local(local_files, "pq")[0])
    directory = tmp_path / "cache"
    cache = file_cache.LocalCache(str(directory), _options(up), max_bytes=size + size // 2)
    first, second = _urls("pq")[:2]
    with cache.pinned(first) as pinned_path:
        other = cache.fetch(second)  # Over the bound: the unpinned would go.
        assert os.path.exists(pinned_path) and os.path.exists(other)
    left = [n for n in os.listdir(directory) if not n.startswith(".")]
    assert len(left) == 1  # Released: the bound holds again.


def test_a_copy_evicted_before_every_pin_is_a_clear_error(up, tmp_path, monkeypatch):
    cache = file_cache.LocalCache(str(tmp_path / "cache"), _options(up))
    # Always gone (or damaged) before the pin.
    monkeypatch.setattr(file_cache, "_valid_copy", lambda dir_fd, name, info: False)
    with pytest.raises(remote.RemoteReadError, match=r"part-0\.parquet.*evicted.*cache_max_bytes"):
        with cache.pinned(_urls("pq")[0]):
            pass


def test_missing_object_and_bucket_are_named(up):
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        ParquetDataSource(f"s3://{BUCKET}/pq/nope.parquet", remote_options=_options(up))
    with pytest.raises(FileNotFoundError, match="no-such-bucket"):
        iter(ParquetIterDataset("s3://no-such-bucket/x.parquet", remote_options=_options(up)))


def test_missing_credentials_are_reported_with_the_object(up):
    storage = up.storage_options()
    del storage["key"], storage["secret"]
    options = remote.RemoteOptions(storage_options=storage, attempts=1)
    with pytest.raises(remote.RemoteAccessError, match="part-0.parquet.*credentials"):
        ParquetDataSource(_urls("pq")[0], remote_options=options)


@pytest.mark.parametrize("workers", [0, 2])
def test_server_killed_mid_epoch_is_a_clear_error_then_resume_after_restart(server, up, local_files, workers):
    url = f"s3://{BUCKET}/big/big.parquet"
    options = _options(up, block_size=1024, read_ahead=0)
    source = ParquetDataSource(url, remote_options=options, cached_row_groups=1)
    expected = _ids(_loader(ParquetDataSource(local_files["big/big.parquet"]), workers, batch=8))
    it = iter(_loader(source, workers, batch=8))
    head = [next(it)["id"].tolist() for _ in range(2)]
    state = it.get_state()
    server.stop()
    with pytest.raises(remote.RemoteReadError, match=r"s3://grainlike-data/big/big.parquet.*2 attempts"):
        for _ in it:
            pass
    it.close()
    server.start()
    server.upload(BUCKET, local_files)  # moto keeps objects in memory only
    again = iter(_loader(ParquetDataSource(url, remote_options=options), workers, batch=8))
    again.set_state(state)
    assert head + _ids(again) == expected


def test_reads_retry_with_backoff_until_the_network_is_back(up):
    proxy = TcpProxy(up.port)
    try:
        storage = {**up.storage_options(), "endpoint_url": proxy.endpoint_url}
        options = remote.RemoteOptions(storage_options=storage, attempts=8, backoff_s=0.2, max_backoff_s=1.0)
        proxy.down()
        restorer = threading.Timer(0.5, proxy.up)
        restorer.start()
        start = time.monotonic()
        with remote.RemoteFile(_urls("pq")[1], options) as f:
            assert f.read(4) == b"PAR1"
        assert time.monotonic() - start >= 0.5
        restorer.join()
        proxy.down()
        with pytest.raises(remote.RemoteReadError, match="part-1.parquet.*3 attempts"):
            with remote.RemoteFile(_urls("pq")[1], dataclasses.replace(options, attempts=3, backoff_s=0.01)) as f:
                f.read(4)
    finally:
        proxy.close()


def test_transient_failures_are_told_from_final_ones():
    botocore = pytest.importorskip("botocore.exceptions")
    throttled = botocore.ClientError({"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."}}, "GetObject")
    calls = []

    def throttled_twice():
        calls.append(1)
        if len(calls) < 3:
            raise throttled
        return b"ok"

    options = remote.RemoteOptions(attempts=3, backoff_s=0.01)
    assert remote.with_retries(throttled_twice, "s3://b/k", "read", options) == b"ok"
    assert len(calls) == 3
    with pytest.raises(remote.RemoteReadError, match=r"'s3://b/k': failed to read after 3 attempts: ClientError.*SlowDown"):
        remote.with_retries(lambda: (_ for _ in ()).throw(throttled), "s3://b/k", "read", options)
    denied = botocore.NoCredentialsError()
    with pytest.raises(remote.RemoteAccessError, match="s3://b/k"):
        remote.with_retries(lambda: (_ for _ in ()).throw(denied), "s3://b/k", "read", options)
    with pytest.raises(ValueError, match="boom"):  # not a remote failure: raised as it is, once
        remote.with_retries(lambda: (_ for _ in ()).throw(ValueError("boom")), "s3://b/k", "read", options)


def test_remote_file_reads_ranges_like_the_local_file(up, local_files):
    path = _local(local_files, "pq")[0]
    with open(path, "rb") as f:
        data = f.read()
    with remote.RemoteFile(_urls("pq")[0], _options(up, block_size=100, read_ahead=3)) as f:
        assert f.size == len(data)
        assert f.read(250) == data[:250]
        f.seek(-30, os.SEEK_END)
        assert f.read() == data[-30:]
        f.seek(120)
        assert f.read(1000) == data[120:1120]
        assert f.read(0) == b""


def test_sources_pickle_without_connections(up):
    import pickle

    source = ParquetDataSource(_urls("pq"), remote_options=_options(up))
    first = source[3]
    clone = pickle.loads(pickle.dumps(source))
    assert clone[3] == first


def test_local_paths_as_file_urls_and_epath(local_files):
    epath = pytest.importorskip("etils.epath")
    paths = _local(local_files, "pq")
    by_url = ParquetDataSource(["file://" + p for p in paths])
    by_epath = ParquetDataSource([epath.Path(p) for p in paths])
    assert [by_url[k]["text"] for k in range(len(by_url))] == [by_epath[k]["text"] for k in range(len(by_epath))]
    ar = ArrayRecordDataSource(["file://" + p for p in _local(local_files, "ar")])
    assert ar[PER_SHARD] == _records(1)[0]


def test_epath_objects_name_remote_files(up, tmp_path):
    epath = pytest.importorskip("etils.epath")
    ar = ArrayRecordDataSource([epath.Path(u) for u in _urls("ar")], remote_options=_options(up, tmp_path))
    assert ar[PER_SHARD + 2] == _records(1)[2]
    assert repr(ar) == repr(ArrayRecordDataSource(_urls("ar"), remote_options=_options(up, tmp_path)))
    pq_source = ParquetDataSource([epath.Path(u) for u in _urls("pq")], remote_options=_options(up))
    assert int(pq_source[PER_SHARD]["id"]) == 100
    rows = iter(ParquetIterDataset(epath.Path(_urls("pq")[1]), remote_options=_options(up)))
    assert int(next(rows)["id"]) == 100


def test_array_record_counts_from_the_tail_without_copying_the_files(up, tmp_path, monkeypatch):
    from grainlike.sources.formats import array_record_files

    reads = []
    original = remote.read_range

    def recording(url, start, end, options, pin=None):
        reads.append((url, end - start))
        return original(url, start, end, options, pin)

    monkeypatch.setattr(remote, "read_range", recording)
    # A tail far smaller than the footer: the count must grow it, never guess from zeros.
    monkeypatch.setattr(array_record_files, "_FIRST_TAIL_BYTES", 16)
    source = ArrayRecordDataSource(_urls("ar"), remote_options=_options(up, tmp_path))
    assert len(source) == SHARDS * PER_SHARD
    assert not os.path.exists(tmp_path / "cache")  # nothing copied to build it
    tails = [n for url, n in reads if url == _urls("ar")[0]]
    assert tails[0] == 16 and len(tails) >= 2 and tails == sorted(tails)
    assert source[PER_SHARD - 1] == _records(0)[-1]
    assert [n for n in os.listdir(tmp_path / "cache") if not n.startswith(".")]  # copied on first read


def test_threads_fetching_one_file_copy_it_once(up, local_files, tmp_path, monkeypatch):
    from concurrent import futures

    copies = []
    original = remote.read_range

    def counting(url, start, end, options, pin=None):
        if url == _urls("pq")[0]:
            copies.append((start, end))
            time.sleep(0.05)  # long enough for the other threads to arrive meanwhile
        return original(url, start, end, options, pin)

    monkeypatch.setattr(remote, "read_range", counting)
    cache = file_cache.LocalCache(str(tmp_path / "cache"), _options(up))
    with futures.ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(cache.fetch, [_urls("pq")[0]] * 4))
    assert len(set(paths)) == 1 and len(copies) == 1
    with open(paths[0], "rb") as f, open(_local(local_files, "pq")[0], "rb") as g:
        assert f.read() == g.read()


def test_array_record_cached_files_read_without_the_server(server, up, tmp_path):
    import pickle

    source = ArrayRecordDataSource(_urls("ar"), remote_options=_options(up, tmp_path))
    assert [source[0], source[PER_SHARD]] == [_records(0)[0], _records(1)[0]]  # both copied
    clone = pickle.loads(pickle.dumps(source))  # as a worker receives it: no open reader
    server.stop()
    assert clone[PER_SHARD + 3] == _records(1)[3]


def test_any_fsspec_protocol_reads_here_memory(local_files, tmp_path):
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    for key, path in local_files.items():
        with open(path, "rb") as f:
            memory.pipe_file(f"/grainlike-test/{key}", f.read())
    try:
        parquet = ParquetDataSource([f"memory://grainlike-test/pq/part-{s}.parquet" for s in range(SHARDS)])
        assert int(parquet[PER_SHARD + 1]["id"]) == 101
        ar = ArrayRecordDataSource(
            [f"memory://grainlike-test/ar/train-{s:05d}-of-{SHARDS:05d}.array_record" for s in range(SHARDS)],
            remote_options=remote.RemoteOptions(cache_dir=str(tmp_path / "cache")),
        )
        assert ar[1] == _records(0)[1]
    finally:
        memory.rm("/grainlike-test", recursive=True)


def test_gs_without_gcsfs_says_what_to_install(monkeypatch):
    import importlib
    import sys

    from grainlike.sources.formats import remote_files as remote

    registry = importlib.import_module("fsspec.registry")  # fsspec.registry is a mapping

    # As in an environment without gcsfs: importing it fails, and neither fsspec
    # nor grainlike has a gs:// filesystem from before.
    monkeypatch.setitem(sys.modules, "gcsfs", None)
    for protocol in ("gs", "gcs"):
        monkeypatch.delitem(registry._registry, protocol, raising=False)
    monkeypatch.setattr(remote, "_PER_PROCESS", {})
    with pytest.raises(ImportError, match="gs://bucket/x.parquet.*gcsfs"):
        ParquetDataSource("gs://bucket/x.parquet")
