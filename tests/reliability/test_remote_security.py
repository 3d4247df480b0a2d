"""Remote storage against hostile neighbours, full disks, failing servers and changing objects.

Real parts only: moto's S3 server and the GCS emulator on localhost (reads go
through fsspec + s3fs / gcsfs), a proxy in front of the S3 server for HTTP
failures, another local user (``nobody``, through ``setpriv``) for the attacks
on the cache directory, and a real 1 MiB tmpfs for the full disk.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import tempfile
import time

import numpy as np
import pytest

from grainlike.sources.formats import file_cache
from grainlike.sources.formats import remote_files as remote

pytest.importorskip("s3fs")
pytest.importorskip("moto")
pytest.importorskip("pyarrow.parquet")

from tests.sources.s3_server import FaultyHttpProxy, serving  # noqa: E402
from tests.helpers.array_record_files import write_array_record  # noqa: E402

BUCKET = "grainlike-security"
NOBODY = 65534
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(
    not IS_ROOT, reason="acting as another local user (setpriv --reuid) and mounting a tmpfs need root"
)


def _write_parquet(path: str, first_id: int, rows: int = 400) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": np.arange(first_id, first_id + rows, dtype=np.int64)})
    pq.write_table(table, path, row_group_size=50)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("security-src")
    blob = d / "blob.bin"
    blob.write_bytes(np.random.default_rng(0).bytes(300_000))
    big = d / "big.bin"
    big.write_bytes(np.random.default_rng(1).bytes(2_500_000))  # Over a 1 MiB tmpfs.
    return {
        "blob.bin": str(blob),
        "big.bin": str(big),
        "data.parquet": _write_parquet(str(d / "data.parquet"), 0),
        "changing.parquet": _write_parquet(str(d / "changing.parquet"), 0),
    }


@pytest.fixture(scope="module")
def s3(corpus):
    with serving(BUCKET, corpus) as running:
        yield running


@pytest.fixture
def proxy(s3):
    p = FaultyHttpProxy(s3.port)
    try:
        yield p
    finally:
        p.close()


def _options(s3, cache_dir=None, **kwargs) -> remote.RemoteOptions:
    kwargs.setdefault("attempts", 2)
    kwargs.setdefault("backoff_s", 0.01)
    return remote.RemoteOptions(storage_options=s3.storage_options(), cache_dir=cache_dir, **kwargs)


def _proxied_options(s3, proxy, **kwargs) -> remote.RemoteOptions:
    """Options through the proxy, with botocore's own retries off and no timeouts of its own."""
    storage = s3.storage_options(endpoint_url=proxy.endpoint_url)
    del storage["config_kwargs"]  # RemoteOptions' timeout and single-try defaults apply
    kwargs.setdefault("backoff_s", 0.01)
    return remote.RemoteOptions(storage_options=storage, **kwargs)


def _url(key: str) -> str:
    return f"s3://{BUCKET}/{key}"


@pytest.fixture
def shared_tmp():
    """A directory like /tmp: world-writable with the sticky bit, reachable by every user."""
    d = tempfile.mkdtemp(prefix="grainlike-shared-", dir="/tmp")
    os.chmod(d, 0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _as_nobody(script: str) -> None:
    subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sh", "-ec", script],
        check=True, timeout=30,
    )


# -- 1. the cache directory belongs to this user only ---------------------------------


@needs_root
def test_default_cache_dir_planted_by_another_user_is_refused_and_its_symlink_not_followed(
    s3, shared_tmp, tmp_path, monkeypatch
):
    monkeypatch.setattr(tempfile, "tempdir", shared_tmp)
    options = _options(s3)
    url = _url("blob.bin")
    cache_dir = file_cache.default_cache_dir()
    assert os.path.dirname(cache_dir) == shared_tmp
    name = file_cache.LocalCache(cache_dir, options)._name(url, remote.object_info(url, options))
    victim = tmp_path / "victim"
    victim.mkdir()
    target = victim / "created-by-root"
    # The attacker guesses the directory and the lock file's name, and plants a
    # copy of their own.
    _as_nobody(
        f"mkdir -m 0777 {cache_dir}; ln -s {target} {cache_dir}/.lock-{name}; "
        f"printf attacker > {cache_dir}/{name}; chmod 0666 {cache_dir}/{name}"
    )
    with pytest.raises(remote.UnsafeCacheDirError, match=rf"{cache_dir}.*owned by uid {NOBODY}.*cache_dir"):
        file_cache.cache_for(options).fetch(url)
    assert not target.exists()


@needs_root
def test_default_cache_dir_that_is_another_users_symlink_is_refused(s3, shared_tmp, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", shared_tmp)
    options = _options(s3)
    cache_dir = file_cache.default_cache_dir()
    elsewhere = os.path.join(shared_tmp, "attackers")
    _as_nobody(f"mkdir -m 0777 {elsewhere}; ln -s {elsewhere} {cache_dir}")
    with pytest.raises(remote.UnsafeCacheDirError, match=rf"{cache_dir}.*symlink.*cache_dir"):
        file_cache.cache_for(options).fetch(_url("blob.bin"))
    assert os.listdir(elsewhere) == []


def test_a_given_cache_dir_writable_by_group_is_refused_naming_it(s3, tmp_path):
    cache_dir = tmp_path / "shared-cache"
    cache_dir.mkdir()
    os.chmod(cache_dir, 0o775)
    with pytest.raises(remote.UnsafeCacheDirError, match=rf"{cache_dir}.*mode 0775.*cache_dir"):
        file_cache.cache_for(_options(s3, str(cache_dir))).fetch(_url("blob.bin"))


@needs_root
def test_an_own_default_cache_dir_only_readable_by_others_is_made_private(s3, shared_tmp, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", shared_tmp)
    cache_dir = file_cache.default_cache_dir()
    os.mkdir(cache_dir, 0o755)  # as earlier versions made it
    os.chmod(cache_dir, 0o755)
    file_cache.cache_for(_options(s3)).fetch(_url("blob.bin"))
    assert stat.S_IMODE(os.lstat(cache_dir).st_mode) == 0o700


@needs_root
def test_a_cache_dir_owned_by_another_user_is_refused(s3, tmp_path):
    cache_dir = tmp_path / "theirs"
    cache_dir.mkdir(mode=0o755)
    os.chown(cache_dir, NOBODY, NOBODY)
    with pytest.raises(remote.UnsafeCacheDirError, match=rf"{cache_dir}.*owned by uid {NOBODY}"):
        file_cache.cache_for(_options(s3, str(cache_dir))).fetch(_url("blob.bin"))


def test_a_new_cache_dir_is_0700_and_its_files_0600(s3, corpus, tmp_path):
    old = os.umask(0)  # the mode must not depend on a permissive umask
    try:
        cache_dir = tmp_path / "parent" / "cache"
        path = file_cache.cache_for(_options(s3, str(cache_dir))).fetch(_url("blob.bin"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(cache_dir).st_mode) == 0o700
    names = os.listdir(cache_dir)
    assert {n.split("-", 1)[0] for n in names} >= {".lock", ".meta"}
    for n in names:
        assert stat.S_IMODE(os.lstat(cache_dir / n).st_mode) == 0o600, n
    with open(path, "rb") as f, open(corpus["blob.bin"], "rb") as g:
        assert f.read() == g.read()


# -- 2. every write is checked; a damaged copy is fetched again --------------------------


def test_a_truncated_cached_copy_is_detected_and_fetched_again(s3, corpus, tmp_path):
    cache = file_cache.cache_for(_options(s3, str(tmp_path / "cache")))
    path = cache.fetch(_url("blob.bin"))
    os.truncate(path, 1000)  # as a disk that filled up under an earlier writer leaves it
    again = cache.fetch(_url("blob.bin"))
    with open(again, "rb") as f, open(corpus["blob.bin"], "rb") as g:
        assert f.read() == g.read()


def test_short_writes_are_continued_until_the_block_is_written(s3, corpus, tmp_path, monkeypatch):
    real = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: real(fd, bytes(data[: max(1, len(data) // 3)]), offset))
    path = file_cache.cache_for(_options(s3, str(tmp_path / "cache"), block_size=64 << 10)).fetch(_url("blob.bin"))
    monkeypatch.undo()
    with open(path, "rb") as f, open(corpus["blob.bin"], "rb") as g:
        assert f.read() == g.read()


def test_a_full_disk_is_one_clear_error_and_leaves_no_partial_copy(s3, tmp_path, monkeypatch):
    real = os.pwrite
    calls = []

    def short_then_full(fd, data, offset):
        calls.append(offset)
        if len(calls) == 1:
            return real(fd, bytes(data[:100]), offset)  # short: the disk is filling
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", short_then_full)
    cache_dir = tmp_path / "cache"
    with pytest.raises(remote.CacheFullError, match=rf"blob\.bin.*no space.*{cache_dir}.*cache_dir") as e:
        file_cache.cache_for(_options(s3, str(cache_dir), block_size=64 << 10, attempts=1)).fetch(_url("blob.bin"))
    assert e.value.errno == errno.ENOSPC
    assert [n for n in os.listdir(cache_dir) if not n.startswith(".lock-")] == []


@needs_root
def test_a_real_full_tmpfs_is_one_clear_error_and_leaves_no_partial_copy(s3, tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        cache_dir = mount / "cache"
        with pytest.raises(remote.CacheFullError, match=rf"big\.bin.*{cache_dir}"):
            file_cache.cache_for(_options(s3, str(cache_dir), attempts=1)).fetch(_url("big.bin"))
        assert [n for n in os.listdir(cache_dir) if not n.startswith(".lock-")] == []
        # Room again (a smaller object): the cache works on the same disk.
        small = file_cache.cache_for(_options(s3, str(cache_dir))).fetch(_url("blob.bin"))
        assert os.path.getsize(small) == 300_000
    finally:
        subprocess.run(["umount", str(mount)], check=True)


# -- 3. failing and slow servers ---------------------------------------------------------


def test_a_server_answering_500_is_a_remote_read_error_with_status_and_attempts(s3, proxy):
    from grainlike.sources.parquet import ParquetDataSource

    proxy.mode = "500"
    options = _proxied_options(s3, proxy, attempts=3)
    with pytest.raises(remote.RemoteReadError, match=r"data\.parquet.*after 3 attempts.*HTTP 500") as e:
        ParquetDataSource(_url("data.parquet"), remote_options=options)
    assert (e.value.status, e.value.attempts, proxy.gets) == (500, 3, 3)


def test_a_slow_server_times_out_and_is_retried_within_the_bound(s3, proxy):
    proxy.mode, proxy.delay_s = "slow", 5.0
    options = _proxied_options(s3, proxy, attempts=2, timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(remote.RemoteReadError, match=r"blob\.bin.*after 2 attempts.*timeout_s"):
        remote.RemoteFile(_url("blob.bin"), options).read(10)
    # attempts * timeout_s plus backoff and connection set-up, far below one slow answer.
    assert time.monotonic() - start < 4.0
    assert proxy.gets == 2


def test_a_connection_reset_mid_answer_is_retried(s3, proxy, corpus):
    proxy.mode, proxy.faults = "reset", 1
    options = _proxied_options(s3, proxy, attempts=3, read_ahead=0)
    with remote.RemoteFile(_url("blob.bin"), options) as f:
        data = f.read(5000)
    with open(corpus["blob.bin"], "rb") as g:
        assert data == g.read(5000)
    assert proxy.gets == 2


# -- 4. an object overwritten during an epoch -------------------------------------------


def _overwrite(s3, key: str, path: str) -> None:
    s3.client().upload_file(path, BUCKET, key)


def test_a_parquet_object_overwritten_mid_epoch_raises_naming_old_and_new_etag(s3, corpus, tmp_path):
    from grainlike.sources.parquet import ParquetDataSource

    key = "changing.parquet"
    _overwrite(s3, key, corpus[key])
    options = _options(s3, block_size=1024, read_ahead=0)
    old = remote.object_info(_url(key), options)["etag"]
    source = ParquetDataSource(_url(key), remote_options=options, cached_row_groups=1)
    assert int(source[0]["id"]) == 0
    _overwrite(s3, key, _write_parquet(str(tmp_path / "new.parquet"), 1000))
    new = remote.object_info(_url(key), options)["etag"]
    assert new != old
    with pytest.raises(remote.ObjectChangedError) as e:
        source[399]
    assert "changing.parquet" in str(e.value) and old in str(e.value) and new in str(e.value)


def test_a_cached_copy_is_of_the_pinned_version_or_an_error(s3, corpus, tmp_path):
    key = "changing.parquet"
    _overwrite(s3, key, corpus[key])
    options = _options(s3, str(tmp_path / "cache"), block_size=1024)
    pin = remote.object_info(_url(key), options)
    _overwrite(s3, key, _write_parquet(str(tmp_path / "new.parquet"), 1000))
    with pytest.raises(remote.ObjectChangedError, match=r"changing\.parquet"):
        file_cache.cache_for(options).fetch(_url(key), pin)
    assert [n for n in os.listdir(tmp_path / "cache") if not n.startswith(".lock-")] == []


def _parquet_iter(url: str, options):
    from grainlike.dataset.sources.parquet_iter_dataset import ParquetIterDataset

    return iter(ParquetIterDataset(url, remote_options=options))


def test_a_remote_parquet_iterators_state_names_the_version_and_a_restore_onto_a_changed_object_is_refused(
    s3, corpus, tmp_path
):
    key = "restored.parquet"
    _overwrite(s3, key, corpus["changing.parquet"])
    options = _options(s3, block_size=4096)
    it = _parquet_iter(_url(key), options)
    for _ in range(70):  # into the second row group
        next(it)
    state = it.get_state()
    pin = remote.object_info(_url(key), options)
    assert state["object"]["version"] == pin["version"] and state["object"]["size"] == pin["size"]
    assert {"row_group": 1, "index_within_row_group": 20}.items() <= state.items()
    # Restored onto the same object: the next rows follow.
    again = _parquet_iter(_url(key), options)
    again.set_state(state)
    assert int(next(again)["id"]) == 70
    # Overwritten since (a bucket without versioning keeps no old version).
    _overwrite(s3, key, _write_parquet(str(tmp_path / "new.parquet"), 1000))
    changed = _parquet_iter(_url(key), options)
    with pytest.raises(remote.ObjectChangedError) as e:
        changed.set_state(state)
    assert key in str(e.value) and pin["version"] in str(e.value)
    assert "state being restored" in "".join(getattr(e.value, "__notes__", []))
    # A state without the version (grain's, or a local file's) restores as grain would.
    plain = _parquet_iter(_url(key), options)
    plain.set_state({"row_group": 1, "index_within_row_group": 20})
    assert int(next(plain)["id"]) == 1070


def test_a_restore_reads_the_checkpoints_version_where_the_bucket_keeps_versions(s3, corpus, tmp_path):
    bucket = "grainlike-versioned"
    client = s3.client()
    client.create_bucket(Bucket=bucket)
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    url = f"s3://{bucket}/data.parquet"
    client.upload_file(corpus["changing.parquet"], bucket, "data.parquet")
    options = _options(s3, block_size=4096)
    it = _parquet_iter(url, options)
    for _ in range(70):
        next(it)
    state = it.get_state()
    assert state["object"].get("version_id")
    client.upload_file(_write_parquet(str(tmp_path / "new.parquet"), 1000), bucket, "data.parquet")
    restored = _parquet_iter(url, options)
    restored.set_state(state)
    assert [int(next(restored)["id"]) for _ in range(3)] == [70, 71, 72]  # the old version's rows


def test_a_local_parquet_iterators_state_has_only_grains_two_keys(tmp_path):
    from grainlike.dataset.sources.parquet_iter_dataset import ParquetIterDataset

    it = iter(ParquetIterDataset(_write_parquet(str(tmp_path / "local.parquet"), 0)))
    next(it)
    assert it.get_state() == {"row_group": 0, "index_within_row_group": 1}


def test_a_gcs_object_overwritten_while_open_raises_naming_both_generations(tmp_path):
    pytest.importorskip("gcsfs")
    pytest.importorskip("gcp_storage_emulator")
    from tests.sources.gcs_server import LocalGcsServer

    server = LocalGcsServer()
    server.start()
    try:
        first, second = tmp_path / "a.bin", tmp_path / "b.bin"
        first.write_bytes(b"a" * 5000)
        second.write_bytes(b"b" * 5000)
        server.upload("grainlike-gcs-security", {"x.bin": str(first)})
        url = "gs://grainlike-gcs-security/x.bin"
        options = remote.RemoteOptions(storage_options=server.storage_options(), block_size=1000,
                                       read_ahead=0, attempts=2, backoff_s=0.01)
        with remote.RemoteFile(url, options) as f:
            assert f.read(1000) == b"a" * 1000
            old = f.pin["generation"]
            server.upload("grainlike-gcs-security", {"x.bin": str(second)})
            with pytest.raises(remote.ObjectChangedError, match=rf"x\.bin.*generation {old}.*generation \d+"):
                f.read(1000)
    finally:
        server.stop()


def test_a_full_disk_while_writing_the_sidecar_leaves_no_copy(s3, tmp_path, monkeypatch):
    real = os.write

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    cache_dir = tmp_path / "cache"
    with pytest.raises(remote.CacheFullError, match=rf"blob\.bin.*{cache_dir}"):
        file_cache.cache_for(_options(s3, str(cache_dir), attempts=1)).fetch(_url("blob.bin"))
    monkeypatch.setattr(os, "write", real)
    assert [n for n in os.listdir(cache_dir) if not n.startswith(".lock-")] == []


def test_an_array_record_shard_overwritten_after_the_source_was_built_is_an_error(s3, tmp_path):
    from grainlike.sources.array_record import ArrayRecordDataSource

    def shard(name: str, prefix: bytes) -> str:
        return write_array_record(tmp_path / name, [prefix + b"%03d" % i for i in range(20)])

    key = "changing.array_record"
    _overwrite(s3, key, shard("old.array_record", b"old"))
    source = ArrayRecordDataSource(_url(key), remote_options=_options(s3, str(tmp_path / "cache")))
    _overwrite(s3, key, shard("new.array_record", b"new-and-longer"))
    with pytest.raises(remote.ObjectChangedError, match=r"changing\.array_record"):
        source[0]
