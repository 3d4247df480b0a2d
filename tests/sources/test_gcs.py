"""Remote files (gs://) against a real GCS-compatible server started on localhost.

The server is gcp-storage-emulator's, in its own process group, ended by the
fixture; reads go through fsspec + gcsfs (no mock of any client library),
anonymously, at the server's ``endpoint_url``.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import grainlike as gl
from grainlike.dataset.conformance import assert_equal_output_after_checkpoint
from grainlike.sources.formats import remote_files as remote
from grainlike.sources.array_record import ArrayRecordDataSource
from grainlike.sources.parquet import ParquetDataSource

from tests.helpers import leaks
from tests.sources.corpus import write_corpus
from tests.sources.gcs_server import LocalGcsServer  # before gcsfs is imported: it sets gcsfs up

pytest.importorskip("gcsfs")
pytest.importorskip("gcp_storage_emulator")
pytest.importorskip("pyarrow")
pytest.importorskip("pyarrow.parquet")
pytest.importorskip("array_record.python.array_record_module")

BUCKET = "grainlike-gcs"
SHARDS = 2
PER_SHARD = 10
BIG = 800


def _records(shard: int) -> list:
    return [f"gs-shard{shard}-record{i:03d}".encode() for i in range(PER_SHARD)]


@pytest.fixture(scope="module")
def local_files(tmp_path_factory) -> dict:
    """``{object key: local path}``: two ArrayRecord shards, two Parquet files, a bigger Parquet file."""
    return write_corpus(
        tmp_path_factory.mktemp("gcs-src"), _records, SHARDS, BIG, lambda shard: f"train-{shard}.array_record"
    )


@pytest.fixture(scope="module")
def server(local_files):
    gcs = LocalGcsServer()
    gcs.start()
    try:
        gcs.upload(BUCKET, local_files)
        yield gcs
    finally:
        gcs.stop()


@pytest.fixture
def up(server, local_files):
    """The server, running with the data (restarted if a test stopped it)."""
    if not server.running():
        server.start()
        server.upload(BUCKET, local_files)
    return server


@pytest.fixture
def no_worker_leaks(server):
    """No worker process, shared-memory segment or worker thread outlives the test.

    Descriptors are not compared: the process's GCS filesystem keeps its
    session and event loop for later reads. The server, restarted by some
    tests, is not a leftover.
    """
    def children():
        return leaks.worker_children() - ({server.proc.pid} if server.proc else set())

    def threads():
        # The read-ahead threads ("grainlike-remote") are one pool per process, kept for later reads.
        return {t for t in leaks.grainlike_threads() if not t.startswith("grainlike-remote")}

    before_children, before_shm, before_threads = children(), leaks.own_shm_entries(), threads()
    yield
    assert leaks.wait_until(lambda: children() <= before_children), children() - before_children
    assert leaks.wait_until(lambda: leaks.own_shm_entries() <= before_shm), leaks.own_shm_entries() - before_shm
    assert leaks.wait_until(lambda: threads() <= before_threads), threads() - before_threads


def _options(server, tmp_path=None, requests_timeout: float = 2, **kwargs) -> remote.RemoteOptions:
    kwargs.setdefault("attempts", 2)
    kwargs.setdefault("backoff_s", 0.01)
    return remote.RemoteOptions(
        storage_options=server.storage_options(requests_timeout=requests_timeout),
        cache_dir=None if tmp_path is None else str(tmp_path / "cache"),
        **kwargs,
    )


def _keys(kind: str) -> list:
    ext = "array_record" if kind == "ar" else "parquet"
    name = "train" if kind == "ar" else "part"
    return [f"{kind}/{name}-{s}.{ext}" for s in range(SHARDS)]


def _urls(kind: str) -> list:
    return [f"gs://{BUCKET}/{key}" for key in _keys(kind)]


def _local(local_files, kind: str) -> list:
    return [local_files[key] for key in _keys(kind)]


def _loader(source, workers: int, batch: int = 4, read_options=None):
    return gl.DataLoader(
        data_source=source,
        sampler=gl.IndexSampler(len(source), gl.NoSharding(), shuffle=True, num_epochs=1, seed=7),
        operations=[gl.Batch(batch)],
        worker_count=workers,
        read_options=read_options,
    )


def _ids(batches) -> list:
    return [b.tolist() if isinstance(b, np.ndarray) else b["id"].tolist() for b in batches]


def _read_restore_and_compare(make_source, local_source, workers: int) -> None:
    """A DataLoader over ``make_source()`` gives the local file's batches, and restores mid-epoch."""
    expected = _ids(_loader(local_source, workers))
    it = iter(_loader(make_source(), workers))
    head = _ids([next(it) for _ in range(2)])
    state = it.get_state()
    tail = _ids(it)
    assert head + tail == expected
    again = iter(_loader(make_source(), workers))
    again.set_state(state)
    assert _ids(again) == tail


def test_filesystem_under_test_is_gcsfs_on_the_local_server(up):
    import gcsfs.core

    fs = remote._filesystem(_urls("pq")[0], _options(up))
    # The plain filesystem, not gcsfs's gRPC-probing one (see gcs_server.py).
    assert type(fs) is gcsfs.core.GCSFileSystem
    assert fs._location == up.endpoint_url


@pytest.mark.parametrize("workers", [0, 2])
def test_array_record_shards_from_gcs_through_data_loader_and_restore(up, local_files, tmp_path, workers, no_worker_leaks):
    local = ArrayRecordDataSource(_local(local_files, "ar"))
    source = ArrayRecordDataSource(_urls("ar"), remote_options=_options(up, tmp_path))
    assert len(source) == len(local) == SHARDS * PER_SHARD
    _read_restore_and_compare(
        lambda: ArrayRecordDataSource(_urls("ar"), remote_options=_options(up, tmp_path)), local, workers
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_parquet_from_gcs_through_data_loader_and_restore(up, local_files, workers, no_worker_leaks):
    options = _options(up, block_size=512)  # several ranged reads per file
    _read_restore_and_compare(
        lambda: ParquetDataSource(_urls("pq"), remote_options=options), ParquetDataSource(_local(local_files, "pq")),
        workers,
    )


def test_map_datasets_from_gcs_equal_local_and_restore_at_every_step(up, local_files, tmp_path, no_worker_leaks):
    def records(paths, options=None):
        return gl.MapDataset.source(ArrayRecordDataSource(paths, remote_options=options)).shuffle(seed=2)

    ar = records(_urls("ar"), _options(up, tmp_path)).to_iter_dataset()
    assert list(ar.mp_prefetch(gl.MultiprocessingOptions(num_workers=2))) == list(records(_local(local_files, "ar")))
    assert_equal_output_after_checkpoint(ar)

    def ids(paths, options=None):
        ds = gl.MapDataset.source(ParquetDataSource(paths, remote_options=options)).shuffle(seed=4)
        return ds.map(lambda r: int(r["id"])).to_iter_dataset()

    parquet = ids(_urls("pq"), _options(up, block_size=512))
    assert list(parquet) == list(ids(_local(local_files, "pq")))
    assert_equal_output_after_checkpoint(parquet)


def test_missing_object_and_bucket_raise_file_not_found_naming_the_url(up, tmp_path):
    url = f"gs://{BUCKET}/pq/nope.parquet"
    with pytest.raises(FileNotFoundError, match=url):
        ParquetDataSource(url, remote_options=_options(up))
    url = f"gs://{BUCKET}/ar/nope.array_record"
    with pytest.raises(FileNotFoundError, match=url):
        ArrayRecordDataSource(url, remote_options=_options(up, tmp_path))
    with pytest.raises(FileNotFoundError, match="gs://no-such-bucket/x.parquet"):
        ParquetDataSource("gs://no-such-bucket/x.parquet", remote_options=_options(up))


def test_remote_file_reads_ranges_like_the_local_file(up, local_files):
    with open(local_files["pq/part-1.parquet"], "rb") as f:
        data = f.read()
    with remote.RemoteFile(_urls("pq")[1], _options(up, block_size=100, read_ahead=2)) as f:
        assert f.size == len(data)
        assert f.read(250) == data[:250]
        f.seek(-30, 2)
        assert f.read() == data[-30:]
        f.seek(120)
        assert f.read(700) == data[120:820]


@pytest.mark.parametrize("workers", [0, 2])
def test_server_stopped_mid_epoch_is_a_clear_error_then_resume_after_restart(server, up, local_files, workers):
    url = f"gs://{BUCKET}/big/big.parquet"
    # Requests time out after 3 s: each read fails in about 6 s (two attempts); a
    # worker's first requests on a loaded machine can take over a second.
    options = _options(up, requests_timeout=3, block_size=1024, read_ahead=0)
    expected = _ids(_loader(ParquetDataSource(local_files["big/big.parquet"]), workers, batch=8))
    # One read thread, little read ahead: by default a remote source gets 16 read
    # threads, which on a quick run read the whole file before the server stops.
    short = gl.ReadOptions(num_threads=1, prefetch_buffer_size=8)
    it = iter(_loader(ParquetDataSource(url, remote_options=options, cached_row_groups=1), workers, batch=8,
                      read_options=short))
    head = _ids([next(it) for _ in range(2)])
    state = it.get_state()
    server.pause()  # the server's process stops: connections open, nothing answers
    try:
        with pytest.raises(remote.RemoteReadError, match=r"gs://grainlike-gcs/big/big.parquet.*2 attempts"):
            for _ in it:
                pass
        it.close()
    finally:
        server.restart()  # a fresh, empty server on the same port
    server.upload(BUCKET, local_files)
    # The resumed run is about the position, not about timeouts: a loaded machine
    # may take more than 1 s to answer the fresh server's first requests.
    patient = _options(up, requests_timeout=10, block_size=1024, read_ahead=0)
    again = iter(_loader(ParquetDataSource(url, remote_options=patient), workers, batch=8))
    again.set_state(state)
    assert head + _ids(again) == expected
    again.close()
    assert leaks.wait_until(lambda: leaks.worker_children() <= {server.proc.pid})


def test_reads_retry_with_backoff_until_the_server_answers_again(up, local_files):
    # A request times out after 0.5 s; the server answers again after 1.2 s: only a retry reads.
    # Attempts enough for a loaded machine, where the resumed server may take seconds to answer.
    options = _options(up, requests_timeout=0.5, attempts=30, backoff_s=0.1, max_backoff_s=0.2)
    with open(local_files["pq/part-0.parquet"], "rb") as f:
        magic = f.read(4)
    up.pause()
    resumer = threading.Timer(1.2, up.resume)
    resumer.start()
    try:
        start = time.monotonic()
        with remote.RemoteFile(_urls("pq")[0], options) as f:
            assert f.read(4) == magic == b"PAR1"
        assert time.monotonic() - start >= 1.2
    finally:
        resumer.cancel()
        resumer.join()
        up.resume()
    with pytest.raises(remote.RemoteReadError, match=r"part-0.parquet.*2 attempts.*Timeout"):
        up.pause()
        try:
            remote.RemoteFile(_urls("pq")[0], _options(up, requests_timeout=0.5))
        finally:
            up.resume()


def test_stopping_the_server_leaves_no_process():
    server = LocalGcsServer()
    server.start()
    sid = server.proc.pid  # the leader of its own session
    assert leaks.session_processes(sid)
    server.pause()
    server.stop()  # a paused server too
    assert leaks.wait_until(lambda: not leaks.session_processes(sid))



@pytest.mark.parametrize(
    "status, message, expected",
    [
        (403, "anonymous caller does not have storage.objects.get access", remote.RemoteAccessError),
        (401, "Invalid Credentials", remote.RemoteAccessError),
        (404, "No such object", FileNotFoundError),
        (429, "rate limit exceeded", remote.RemoteReadError),
        (503, "Service Unavailable", remote.RemoteReadError),
    ],
)
def test_gcs_http_failures_are_classified_naming_the_object(status, message, expected):
    import json

    from gcsfs.retry import validate_response

    calls = []

    def request():
        calls.append(1)
        # What gcsfs raises for this response of the JSON API.
        validate_response(status, json.dumps({"error": {"code": status, "message": message}}), "b/bkt/o/x.parquet")

    options = remote.RemoteOptions(attempts=3, backoff_s=0.01)
    with pytest.raises(expected, match="gs://bkt/x.parquet"):
        remote.with_retries(request, "gs://bkt/x.parquet", "read", options)
    # Refusals and missing objects fail at once; only throttling and outages are retried.
    assert len(calls) == (3 if expected is remote.RemoteReadError else 1)
