"""Faults: killed processes, Ctrl-C, consumer exceptions, a full disk.

Complements tests/loader/test_workers.py (worker SIGKILL with small records, main
SIGKILL while workers wait on a full buffer, interrupt_main during next()).
"""

import asyncio
import errno
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

import grainlike as grain
from grainlike.workers import frames
from grainlike.core.errors import WorkerDiedError
from tests.helpers import leaks
from tests.reliability.transforms import Big, Slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _loader(n=24, ops=(), workers=2, epochs=1, **kw):
    kw.setdefault("warm_start", False)  # The faults under test are the workers'.
    return grain.DataLoader(
        data_source=list(range(n)),
        sampler=grain.IndexSampler(n, grain.NoSharding(), shuffle=True, num_epochs=epochs, seed=7),
        operations=list(ops),
        worker_count=workers,
        **kw,
    )


def _firsts(batches):
    """Batches of Big records -> the record values, in order."""
    return [int(v) for b in batches for v in np.asarray(b)[:, 0, 0]]


def _alive(pids):
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _script(tmp_path, body):
    path = tmp_path / "script.py"
    path.write_text(f"import sys\nsys.path.insert(0, {ROOT!r})\n" + textwrap.dedent(body))
    return subprocess.Popen(
        [sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=str(tmp_path), start_new_session=True,
    )


def _expect_line(proc, prefix):
    line = proc.stdout.readline()
    assert line.startswith(prefix), f"expected {prefix!r}, got {line!r}; stderr:\n{proc.stderr.read()}"
    return line[len(prefix):].strip()


# -- worker killed -----------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("then", ["next", "close", "get_state"])
def test_worker_killed_with_shared_memory_batches_in_flight(no_leaks, then):
    loader = _loader(32, [Big(), grain.Batch(2)], workers=2, worker_buffer_size=2)
    with iter(loader) as it:
        expected = _firsts(it)
    it = iter(loader)
    held = [next(it) for _ in range(3)]  # arrays viewing the workers' segments
    copies = [np.array(b) for b in held]
    victim = it._stream._shutdown.procs[0].pid
    os.kill(victim, signal.SIGKILL)
    assert leaks.wait_until(lambda: not _alive([victim]))
    if then == "next":
        with pytest.raises(WorkerDiedError, match="worker 0 of 2 .*SIGKILL"):
            while True:
                held.append(next(it))
        rest = _firsts(it)  # restarts the workers from the last delivered batch
    elif then == "close":
        start = time.monotonic()
        it.close()
        assert time.monotonic() - start < 5
        rest = None
    else:
        state = it.get_state()
        it.close()
        with iter(loader) as it2:
            it2.set_state(state)
            rest = _firsts(it2)
        # (held may be shorter than in "next": only delivered batches count)
    # The batches already received stay valid and unchanged.
    assert all(np.array_equal(a, b) for a, b in zip(copies, held[:3]))
    if rest is not None:
        assert _firsts(held) + rest == expected
    it.close()
    del held
    assert leaks.wait_until(lambda: not leaks.own_shm_entries() - no_leaks.shm)


# -- main process killed -------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_main_killed_while_workers_are_inside_a_long_transform(tmp_path):
    proc = _script(tmp_path, """
        import time
        import grainlike as grain
        from tests.reliability.transforms import Big, Slow

        class SlowAfter(grain.MapTransform):
            def map(self, x):
                if x >= 8:
                    time.sleep(120)  # the workers are stuck here when main dies
                return x

        loader = grain.DataLoader(
            data_source=list(range(100)),
            sampler=grain.IndexSampler(100, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
            operations=[SlowAfter(), Big(), grain.Batch(2)], worker_count=2)
        it = iter(loader)
        keep = [next(it) for _ in range(2)]
        print("pids", " ".join(str(p.pid) for p in it._stream._shutdown.procs), flush=True)
        time.sleep(0.3)
        print("ready", flush=True)
        time.sleep(120)
    """)
    pids = []
    try:
        pids = [int(p) for p in _expect_line(proc, "pids").split()]
        _expect_line(proc, "ready")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        start = time.monotonic()
        assert leaks.wait_until(lambda: not _alive(pids), timeout=5.0), "workers outlived main"
        assert time.monotonic() - start < 5
        assert leaks.wait_until(lambda: not leaks.shm_entries(f"grainlike_{proc.pid}_"), timeout=5.0)
    finally:
        for p in _alive(pids):
            os.kill(p, signal.SIGKILL)
        proc.stdout.close()
        proc.stderr.close()


# -- Ctrl-C -------------------------------------------------------------------------------


@pytest.mark.timeout(40)
def test_sigint_to_the_process_group_during_next(tmp_path):
    # A real Ctrl-C reaches every process of the group: workers ignore it, the
    # consumer gets KeyboardInterrupt. Caught, the iterator loses nothing; not
    # caught, the program exits and takes its workers and segments with it.
    proc = _script(tmp_path, """
        import time
        import numpy as np
        import grainlike as grain
        from tests.reliability.transforms import Big, Slow

        def loader(epochs, ops):
            return grain.DataLoader(
                data_source=list(range(40)),
                sampler=grain.IndexSampler(40, grain.NoSharding(), shuffle=True, num_epochs=epochs, seed=1),
                operations=ops, worker_count=2)

        first = loader(1, [Slow(0.05), Big(), grain.Batch(2)])
        expected = [int(v) for b in first for v in b[:, 0, 0]]
        it = iter(first)
        got = [int(v) for v in next(it)[:, 0, 0]]
        print("ready", flush=True)
        try:
            while True:
                got += [int(v) for v in next(it)[:, 0, 0]]
        except KeyboardInterrupt:
            print("caught", len(got), flush=True)
        except StopIteration:
            print("missed", flush=True)
        got += [int(v) for b in it for v in b[:, 0, 0]]
        print("same", got == expected, flush=True)
        it.close()

        it = iter(loader(None, [Slow(0.02), Big(), grain.Batch(2)]))
        next(it)
        print("pids", " ".join(str(p.pid) for p in it._stream._shutdown.procs), flush=True)
        while True:
            next(it)
    """)
    pids = []
    try:
        _expect_line(proc, "ready")
        time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        _expect_line(proc, "caught")
        assert _expect_line(proc, "same") == "True"
        pids = [int(p) for p in _expect_line(proc, "pids").split()]
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=10)
        err = proc.stderr.read()
        assert proc.returncode != 0 and "KeyboardInterrupt" in err
        assert "resource_tracker" not in err and "Warning" not in err, err
        assert leaks.wait_until(lambda: not _alive(pids), timeout=5.0), "workers outlived main"
        assert not leaks.shm_entries(f"grainlike_{proc.pid}_")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in _alive(pids):
            os.kill(p, signal.SIGKILL)
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.timeout(30)
def test_interrupt_after_a_batch_was_taken_from_a_worker_loses_nothing(no_leaks, monkeypatch):
    # Ctrl-C can land after a worker's message was read but before next() returns
    # it; that batch must come again, not be skipped.
    loader = _loader(24, [Big(), grain.Batch(2)], workers=2)
    with iter(loader) as it:
        expected = _firsts(it)
    original = frames.output
    calls = {"n": 0}

    def interrupted(*args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(*args)

    monkeypatch.setattr(frames, "output", interrupted)
    with iter(loader) as it:
        got = [next(it), next(it)]
        with pytest.raises(KeyboardInterrupt):
            next(it)
        got += list(it)
    assert _firsts(got) == expected


# -- exceptions in the consumer ------------------------------------------------------------


class ConsumerError(Exception):
    pass


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers", [0, 2])
def test_consumer_exception_between_batches_leaves_iterator_working(no_leaks, workers):
    loader = _loader(24, [Big(), grain.Batch(2)], workers=workers)
    with iter(loader) as it:
        expected = _firsts(it)
    it = iter(loader)
    got = []
    for step in range(3):
        try:
            for batch in it:
                got.append(batch)
                if len(got) in (2, 5):
                    raise ConsumerError("training step failed")
        except ConsumerError:
            continue
    assert _firsts(got) == expected
    it.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers", [0, 2])
def test_consumer_exception_inside_with_block_closes_cleanly(no_leaks, workers):
    loader = _loader(24, [Big(), grain.Batch(2)], workers=workers)
    with pytest.raises(ConsumerError):
        with iter(loader) as it:
            for i, batch in enumerate(it):
                if i == 2:
                    raise ConsumerError("boom")
    with pytest.raises(RuntimeError, match="is closed"):
        next(it)
    assert batch.shape == (2, 256, 256)  # still readable after close


# -- full disk ------------------------------------------------------------------------------


async def _save(it, directory):
    write = await it.save(directory)
    await write


async def _load(it, directory):
    read = await it.load(directory)
    await read


def _fill(directory):
    """Fills the filesystem of ``directory``; returns the error that stopped it."""
    chunk = b"x" * 4096
    with open(os.path.join(directory, "filler"), "wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as e:
                return e


@pytest.fixture
def tiny_fs(tmp_path):
    """A 64 KiB tmpfs, where mounting is allowed (root)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()}); the RLIMIT_FSIZE test covers this")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _checkpoint_fails_loudly_and_previous_restores(full_disk, ckpt_dir, expected_errnos):
    loader = _loader(24, [grain.Batch(2)], workers=2)
    with iter(loader) as it:
        expected = [b.tolist() for b in it]
    step1 = ckpt_dir / "1"
    step1.mkdir()
    with iter(loader) as it:
        head = [next(it).tolist() for _ in range(3)]
        asyncio.run(_save(it, step1))  # a good checkpoint after 3 batches
        head.append(next(it).tolist())
        with full_disk():
            # A new checkpoint, and one over the good one, on a full disk: both raise.
            step2 = ckpt_dir / "2"
            step2.mkdir()
            for target in (step2, step1):
                with pytest.raises(OSError) as info:
                    asyncio.run(_save(it, target))
                assert info.value.errno in expected_errnos
        # Nothing half-written is left, and the good one is intact.
        assert sorted(p.name for p in step1.iterdir()) == ["process_0-of-1.json"]
        assert not list((ckpt_dir / "2").iterdir())
        json.loads((step1 / "process_0-of-1.json").read_text())
    assert head == expected[:4]
    with iter(loader) as it:
        asyncio.run(_load(it, step1))
        assert [b.tolist() for b in it] == expected[3:]


@pytest.mark.timeout(30)
def test_checkpoint_on_a_full_tmpfs(no_leaks, tiny_fs):
    import contextlib

    @contextlib.contextmanager
    def full_disk():
        filler = _fill(tiny_fs)
        assert filler.errno == errno.ENOSPC
        yield

    _checkpoint_fails_loudly_and_previous_restores(full_disk, tiny_fs, {errno.ENOSPC})


@pytest.mark.timeout(30)
def test_checkpoint_past_the_file_size_limit(no_leaks, tmp_path):
    # Works without root: RLIMIT_FSIZE makes writes past 64 bytes fail (EFBIG), as a
    # full disk does; Python ignores SIGXFSZ, so the write raises instead.
    import contextlib

    @contextlib.contextmanager
    def full_disk():
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

    _checkpoint_fails_loudly_and_previous_restores(full_disk, tmp_path, {errno.EFBIG})
