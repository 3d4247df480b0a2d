"""DataLoader with worker processes: order, state, shared memory, faults, shutdown."""

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback

import numpy as np
import pytest

import grainlike as grain
from grainlike.core.errors import WorkerDiedError
from tests.helpers import leaks
from tests.reliability.transforms import Slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _loader(n=20, ops=(), workers=2, epochs=1, shuffle=True, seed=3, source=None, **kw):
    # Without warm start (the default) the workers compute everything;
    # test_warm_start.py covers the outputs the calling process computes while
    # they start.
    return grain.DataLoader(
        data_source=list(range(n)) if source is None else source,
        sampler=grain.IndexSampler(n, grain.NoSharding(), shuffle=shuffle, num_epochs=epochs, seed=seed),
        operations=list(ops),
        worker_count=workers,
        **kw,
    )


class Square(grain.MapTransform):
    def map(self, x):
        return {"x": x, "x2": x * x}


class BigRecord(grain.MapTransform):
    """256 KB float32 records."""

    def map(self, x):
        return np.full((256, 256), float(x), np.float32)


class FailAt(grain.MapTransform):
    def __init__(self, bad):
        self.bad = bad

    def map(self, x):
        if x == self.bad:
            raise KeyError(f"record {x} is bad")
        return x


def _plain(batches):
    return [json.dumps({k: np.asarray(v).tolist() for k, v in b.items()}) if isinstance(b, dict) else np.asarray(b).tolist() for b in batches]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_round_robin_order_is_the_reference_rule(no_leaks, workers):
    # Worker w reads local positions w, w+W, ...; outputs are taken round-robin.
    n, bs = 23, 3
    sampler = grain.IndexSampler(n, grain.NoSharding(), shuffle=True, num_epochs=1, seed=5)
    keys = [sampler[i].record_key for i in range(n)]
    expected_per_worker = []
    for w in range(workers):
        mine = keys[w::workers]
        expected_per_worker.append([mine[i : i + bs] for i in range(0, len(mine), bs)])
    expected = []
    for i in range(max(len(b) for b in expected_per_worker)):
        for w in range(workers):
            if i < len(expected_per_worker[w]):
                expected.append(expected_per_worker[w][i])
    with iter(_loader(n, [grain.Batch(bs)], workers=workers, seed=5)) as it:
        got = [b.tolist() for b in it]
    assert got == expected


def test_lambdas_and_local_classes_work_in_workers(no_leaks):
    class Local(grain.MapTransform):
        def __init__(self):
            self.f = lambda x: x + 1000

        def map(self, x):
            return self.f(x)

    with iter(_loader(6, [Local()], workers=2, shuffle=False)) as it:
        assert sorted(it) == [1000 + i for i in range(6)]


def test_state_restores_exactly_mid_epoch_and_across_epochs(no_leaks):
    loader = _loader(17, [Square(), grain.Batch(2)], workers=2, epochs=3)
    with iter(loader) as it:
        full = _plain(it)
    for k in [0, 1, 4, 9, len(full) - 1, len(full)]:
        with iter(loader) as it:
            head = [next(it) for _ in range(k)]
            state = it.get_state()
        with iter(loader) as it2:
            it2.set_state(state)
            assert _plain(it2) == full[k:]
        del head


def test_state_restores_in_a_fresh_process(tmp_path):
    script = tmp_path / "resume.py"
    script.write_text(textwrap.dedent(f"""
        import sys, json
        sys.path.insert(0, {ROOT!r})
        import grainlike as grain
        loader = grain.DataLoader(
            data_source=list(range(30)),
            sampler=grain.IndexSampler(30, grain.NoSharding(), shuffle=True, num_epochs=2, seed=1),
            operations=[grain.Batch(4)], worker_count=2)
        it = iter(loader)
        if sys.argv[1] == "save":
            for _ in range(5):
                next(it)
            open(sys.argv[2], "wb").write(it.get_state())
        else:
            it.set_state(open(sys.argv[2], "rb").read())
        print(json.dumps([b.tolist() for b in it]))
    """))
    state = tmp_path / "state.json"
    first = subprocess.run([sys.executable, str(script), "save", str(state)], capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    second = subprocess.run([sys.executable, str(script), "load", str(state)], capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout) == json.loads(first.stdout)


def test_big_arrays_come_through_shared_memory_and_are_freed(no_leaks):
    loader = _loader(12, [BigRecord(), grain.Batch(4)], workers=2, shuffle=False)
    with iter(loader) as it:
        batches = list(it)
    # The iterator is closed; the arrays stay valid while referenced.
    gc.collect()
    got = sorted(float(v) for b in batches for v in b[:, 0, 0])
    assert got == [float(i) for i in range(12)]
    assert all(b.shape == (4, 256, 256) or b.shape[0] < 4 for b in batches)
    assert all(b.flags.writeable for b in batches)
    view = batches[0][1:2]
    del batches
    gc.collect()
    assert float(view[0, 5, 5]) in [float(i) for i in range(12)]


def test_shared_memory_batch_is_safe_to_device_put_after_close():
    jax = pytest.importorskip("jax")
    loader = _loader(8, [BigRecord(), grain.Batch(4)], workers=2, shuffle=False)
    with iter(loader) as it:
        batch = next(it)
    expected = np.array(batch)
    arr = jax.device_put(batch)
    del batch
    gc.collect()
    # Allocate and scribble on fresh memory; the device array must be unaffected.
    junk = [np.full((4, 256, 256), -1.0, np.float32) for _ in range(8)]
    assert np.array_equal(np.asarray(arr), expected)
    del junk


def test_transform_error_arrives_in_order_with_type_and_worker_traceback(no_leaks):
    loader = _loader(12, [FailAt(7)], workers=2, shuffle=False)
    it = iter(loader)
    got = []
    with pytest.raises(KeyError) as info:
        while True:
            got.append(next(it))
    # Worker 1 holds 7 (positions 1, 3, 5, 7): everything before it came first.
    assert got == [0, 1, 2, 3, 4, 5, 6]
    notes = "\n".join(info.value.__notes__)
    assert "FailAt" in notes and "record_key 7" in notes
    assert "worker 1" in notes
    # The worker's frames end the traceback, down to the transform's line.
    last = traceback.extract_tb(info.value.__traceback__)[-1]
    assert (last.filename, last.name, last.line) == (__file__, "map", 'raise KeyError(f"record {x} is bad")')
    it.close()


def test_unpicklable_transform_error_names_it(no_leaks):
    class HoldsLock(grain.MapTransform):
        def __init__(self):
            self.lock = threading.Lock()

        def map(self, x):
            return x

    it = iter(_loader(4, [Square(), HoldsLock()], workers=2))
    with pytest.raises(TypeError, match=r"operations\[1\].*HoldsLock.*cannot be pickled"):
        next(it)
    it.close()


class HoldsGenerator(grain.MapTransform):
    def __init__(self):
        self.numbers = (i for i in range(3))

    def map(self, x):
        return x


class ReturnsGenerator(grain.MapTransform):
    def map(self, x):
        return (x for _ in range(2))


def _notes_of_first_error(loader):
    it = iter(loader)
    with pytest.raises(TypeError, match="generator") as info:
        next(it)
    it.close()
    return "\n".join(info.value.__notes__)


@pytest.mark.parametrize("ops", [[HoldsGenerator()], [HoldsGenerator(), grain.Batch(2)]], ids=["map", "map-batch"])
def test_a_transform_that_cannot_be_pickled_is_named_with_its_definition(no_leaks, ops):
    notes = _notes_of_first_error(_loader(4, ops, workers=2))
    assert f"the transform HoldsGenerator ({__file__}:" in notes
    assert "cannot be pickled (TypeError: cannot pickle 'generator' object)" in notes


@pytest.mark.parametrize("ops", [[ReturnsGenerator()], [ReturnsGenerator(), grain.Batch(2)]], ids=["map", "map-batch"])
def test_an_output_holding_a_generator_names_the_transform_it_went_through(no_leaks, ops):
    notes = _notes_of_first_error(_loader(4, ops, workers=2))
    assert f"went through the user transforms ReturnsGenerator ({__file__}:" in notes
    if len(ops) == 2:  # the Batch stacked the generators into an object array
        assert "the leaf at <root> (an object array holding builtins.generator)" in notes


def test_killed_worker_raises_quickly_and_next_resumes(no_leaks):
    loader = _loader(40, [Slow(0.02)], workers=2, shuffle=False)
    with iter(loader) as reference:
        expected = list(reference)
    it = iter(loader)
    got = [next(it) for _ in range(6)]
    victim = it._stream.pids[1]
    os.kill(victim, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=r"worker 1 of 2 .*SIGKILL"):
        while True:
            got.append(next(it))
    assert time.monotonic() - start < 5
    assert leaks.wait_until(lambda: not leaks.worker_children() - no_leaks.children)
    # Nothing lost: the iterator restarts the workers from the last delivered output.
    got.extend(it)
    assert got == expected
    it.close()


def test_keyboard_interrupt_during_next_leaves_iterator_usable(no_leaks):
    import _thread

    loader = _loader(6, [Slow(0.5)], workers=2, shuffle=False)
    it = iter(loader)
    timer = threading.Timer(0.2, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        next(it)
    timer.join()
    assert list(it) == list(range(6))
    it.close()


def test_garbage_collected_iterator_stops_its_workers(no_leaks):
    it = iter(_loader(50, [Slow(0.01)], workers=2))
    next(it)
    pids = set(it._stream.pids)
    del it
    gc.collect()
    assert leaks.wait_until(lambda: not (pids & leaks.worker_children()))


def test_len_with_workers_counts_each_workers_partial_batch():
    loader = _loader(23, [grain.Batch(4)], workers=3)
    with iter(loader) as it:
        # 23 records: workers read 8, 8 and 7, each batching its own: 2 + 2 + 2.
        assert len(loader) == len(list(it)) == 2 + 2 + 2


def _run_script(tmp_path, body, timeout=60, env=None):
    script = tmp_path / "script.py"
    script.write_text(f"import sys\nsys.path.insert(0, {ROOT!r})\n" + textwrap.dedent(body))
    return subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=str(tmp_path), env={**os.environ, **(env or {})}, start_new_session=True,
    )


@pytest.mark.parametrize("warm_start", [False, True])
def test_unguarded_script_runs_once_and_exits_without_warnings(tmp_path, warm_start):
    proc = _run_script(tmp_path, f"""
        import grainlike as grain
        print("top-level ran")

        class Triple(grain.MapTransform):
            def map(self, x):
                return x * 3

        loader = grain.DataLoader(
            data_source=list(range(10)),
            sampler=grain.IndexSampler(10, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
            operations=[Triple(), grain.Batch(5)], worker_count=2, warm_start={warm_start})
        print(sorted(v for b in loader for v in b.tolist()))
        it = iter(loader); next(it)  # left open: interpreter exit must clean up
    """)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.count("top-level ran") == 1
    assert "[0, 3, 6, 9, 12, 15, 18, 21, 24, 27]" in out
    assert "resource_tracker" not in err and "Warning" not in err, err


def test_main_killed_by_sigkill_workers_exit_and_segments_go(tmp_path):
    proc = _run_script(tmp_path, """
        import os, time
        import numpy as np
        import grainlike as grain

        class Big(grain.MapTransform):
            def map(self, x):
                time.sleep(0.01)
                return np.zeros((64, 1024), np.float32) + x

        loader = grain.DataLoader(
            data_source=list(range(10000)),
            sampler=grain.IndexSampler(10000, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
            operations=[Big(), grain.Batch(2)], worker_count=2)
        it = iter(loader)
        keep = [next(it) for _ in range(3)]
        print(" ".join(str(p) for p in it._stream.pids), flush=True)
        time.sleep(60)
    """)
    line = proc.stdout.readline()
    pids = [int(p) for p in line.split()]
    assert len(pids) == 2, proc.stderr.read()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    prefix = f"grainlike_{proc.pid}_"

    def gone():
        return all(leaks.process_ended(p) for p in pids)

    try:
        assert leaks.wait_until(gone, timeout=5.0), "workers outlived their killed parent"
        assert leaks.wait_until(lambda: not leaks.shm_entries(prefix), timeout=5.0)
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.stdout.close()
        proc.stderr.close()


def test_enable_profiling_reports_per_worker_timings(tmp_path):
    proc = _run_script(tmp_path, """
        import grainlike as grain
        if __name__ == "__main__":
            loader = grain.DataLoader(
                data_source=list(range(40)),
                sampler=grain.IndexSampler(40, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
                operations=[grain.Batch(4)], worker_count=2, enable_profiling=True)
            with iter(loader) as it:
                assert len(list(it)) == 10
    """)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "grainlike worker 0 of 2: 5 outputs" in err
    assert "grainlike worker 1 of 2: 5 outputs" in err
