"""A batch over maps and filters over ``to_iter_dataset()`` takes whole chunks (``transformations/chunk.py``).

Every pipeline ``MapDataset(...).to_iter_dataset().map(f).filter(g).batch(n)``
moves chunks of elements between its stages; it must be indistinguishable from
the same stages taking one element at a time (forced here by hiding the chunk
protocol): the same batches, the same state after every batch, the same errors
with the same notes, and the same elements after an error and after a restore.
"""

from __future__ import annotations

import contextlib
from typing import Protocol, runtime_checkable
from unittest import mock

import numpy as np
import pytest

import grainlike as grain
from grainlike.dataset.transformations import batch as batch_lib
from grainlike.dataset.transformations import filter as filter_lib
from grainlike.dataset.transformations import map as map_lib
from grainlike.experimental import assert_equal_output_after_checkpoint

N = 700  # Several read chunks.


@runtime_checkable
class _NoChunks(Protocol):
    def _no_such_method(self) -> None: ...


@contextlib.contextmanager
def _one_at_a_time():
    with contextlib.ExitStack() as stack:
        for module in (batch_lib, filter_lib, map_lib):
            stack.enter_context(mock.patch.object(module, "TakesChunks", _NoChunks))
        yield


def _square(x):
    if x == 450:
        raise ValueError(f"square failed at {x}")
    return {"x": np.int64(x), "sq": np.int64(x * x)}


def _not_multiple_of_3(e):
    if e["x"] == 520:
        raise KeyError(f"filter failed at {e['x']}")
    return e["x"] % 3 != 0


def _pipeline(threads: bool, fail: bool = False, nones: bool = False, counting: bool = False, drop: bool = False):
    ds = grain.MapDataset.range(N)
    if nones:
        ds = ds.filter(lambda x: x % 7 != 0)  # None for the removed elements, dropped when read
    options = grain.ReadOptions(num_threads=2, prefetch_buffer_size=16) if threads else grain.ReadOptions(num_threads=0)
    ds = ds.to_iter_dataset(options)
    ds = ds.map(_square if fail else (lambda x: {"x": np.int64(x), "sq": np.int64(x * x)}))
    if counting:
        ds = ds.map_with_index(lambda i, e: {**e, "i": np.int64(i)})
    ds = ds.filter(_not_multiple_of_3 if fail else (lambda e: e["x"] % 3 != 0))
    ds = ds.map(lambda e: {**e, "half": e["x"] / 2})
    return ds.batch(9, drop_remainder=drop)


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in sorted(x.items())}
    return x.tolist() if isinstance(x, np.ndarray) else x


def _run(ds, steps=200):
    it = ds.__iter__()
    out = [it.get_state()]
    for _ in range(steps):
        try:
            out.append(_plain(next(it)))
        except StopIteration:
            out.append("stop")
            break
        except Exception as e:  # noqa: BLE001 - the error is what is compared
            out.append(("error", type(e).__name__, str(e), list(getattr(e, "__notes__", []))))
        out.append(it.get_state())
    return out


def test_the_batch_takes_chunks_through_the_maps_and_filters():
    it = _pipeline(threads=False).__iter__()
    assert it._take is not None
    names = []
    node = it
    while node is not None:
        names.append(type(node).__name__)
        node = node._parents[0] if node._parents else None
    assert names == [
        "_BatchDatasetIterator", "_MapChunksIterator", "_FilterChunksIterator", "_MapChunksIterator",
        "PrefetchDatasetIterator",
    ]
    with _one_at_a_time():
        assert _pipeline(threads=False).__iter__()._take is None


@pytest.mark.parametrize("threads", [False, True])
@pytest.mark.parametrize(
    "kind", ["plain", "nones", "counting", "drop", "fail", "fail-nones"]
)
def test_chunks_match_one_element_at_a_time(threads, kind):
    kw = dict(fail="fail" in kind, nones="nones" in kind, counting=kind == "counting", drop=kind == "drop")
    chunked = _run(_pipeline(threads, **kw))
    with _one_at_a_time():
        expected = _run(_pipeline(threads, **kw))
    assert chunked == expected
    assert chunked[-1] == "stop"
    if kw["fail"]:
        errors = [o for o in chunked if isinstance(o, tuple)]
        assert [e[1] for e in errors] == ["ValueError", "KeyError"]
        # The note names the stage and the state after the failing element, as next() leaves it.
        assert any("square failed" in e[2] and "{'next_index': " in "".join(e[3]) for e in errors)


@pytest.mark.parametrize("threads", [False, True])
def test_restore_anywhere_continues_identically(threads):
    assert_equal_output_after_checkpoint(_pipeline(threads, nones=True))


@pytest.mark.parametrize("threads", [False, True])
def test_a_filter_dropping_too_many_raises_at_the_same_element(threads):
    def build():
        options = grain.ReadOptions(num_threads=2, prefetch_buffer_size=16) if threads else None
        ds = grain.MapDataset.range(2500).to_iter_dataset(options).filter(lambda x: x % 5 < 2).batch(7)
        return grain.experimental.WithOptionsIterDataset(ds, grain.experimental.DatasetOptions(filter_raise_threshold_ratio=0.5))

    chunked = _run(build())
    with _one_at_a_time():
        expected = _run(build())
    assert chunked == expected
    errors = [o for o in chunked if isinstance(o, tuple)]
    assert errors and all(e[1] == "ValueError" and "skipped 60.00 %" in e[2] for e in errors)


def test_a_function_that_raises_base_exception_stops_at_once_with_the_state_after_its_element():
    def interrupt(x):
        if x == 300:
            raise KeyboardInterrupt
        return x

    def run():
        it = grain.MapDataset.range(N).to_iter_dataset().map(interrupt).batch(50).__iter__()
        out = [next(it).tolist() for _ in range(6)]
        with pytest.raises(KeyboardInterrupt):
            next(it)
        out.append(it.get_state())
        out.append(next(it).tolist())
        return out

    chunked = run()
    with _one_at_a_time():
        assert chunked == run()
    assert chunked[6] == {"next_index": 301}


def test_positions_a_restore_skips_are_not_read():
    read = []

    def record(x):
        read.append(x)
        return x

    ds = grain.MapDataset.range(100).map(record).to_iter_dataset(grain.ReadOptions(num_threads=0)).batch(10)
    it = ds.__iter__()
    it.set_state({"next_index": 5, "skip_positions": [6, 7, 50]})
    got = [x for b in it for x in b.tolist()]
    assert got == [x for x in range(5, 100) if x not in (6, 7, 50)]
    assert sorted(read) == got


# random_map and map_with_index count the elements that passed them; under a batch
# they count a chunk at a time, and recount it where a stage above fails.

_COUNTED_N = 260


def _x(e):
    return e if isinstance(e, (int, np.integer)) else e["x"]


def _fails(stage: str, at, x, error=ValueError) -> None:
    if x == at:
        raise error(f"{stage} failed at {x}")


def _stage(ds, i: int, spec: str):
    """Stage ``i``: ``R`` random_map, ``I`` map_with_index, ``M`` map, ``F`` filter, ``K`` interrupt; ``!x``: fails at x."""
    kind, _, at = spec.partition("!")
    at = int(at) if at else None
    key = f"{kind}{i}"
    if kind == "R":

        def draw(e, rng):
            _fails(key, at, _x(e))
            return {"x": _x(e), **({} if isinstance(e, (int, np.integer)) else e), key: int(rng.integers(1 << 30))}

        return ds.random_map(draw, seed=i + 7)
    if kind == "I":

        def index(j, e):
            _fails(key, at, _x(e))
            return {"x": _x(e), **({} if isinstance(e, (int, np.integer)) else e), key: j}

        return ds.map_with_index(index)
    if kind == "M":

        def plus(e):
            _fails(key, at, _x(e))
            return {"x": _x(e), **({} if isinstance(e, (int, np.integer)) else e), key: _x(e) + 1}

        return ds.map(plus)
    if kind == "F":

        def keep(e):
            if e is None:  # (A filter sees the Nones the maps pass through.)
                return True
            _fails(key, at, _x(e), KeyError)
            return _x(e) % (3 + i) != 1

        return ds.filter(keep)
    if kind == "K":  # KeyboardInterrupt in a map: raised at once, with the state after its element.

        def interrupt(e):
            _fails(key, at, _x(e), KeyboardInterrupt)
            return e

        return ds.map(interrupt)
    raise AssertionError(spec)


def _counted(specs: str, threads: bool, batch_fails_at=None, nones: bool = False):
    ds = grain.MapDataset.range(_COUNTED_N)
    if nones:  # None for the removed elements, handed over (allow_nones) to the stages, which count them.
        ds = ds.filter(lambda x: x % 5 != 0)
    options = grain.ReadOptions(num_threads=2, prefetch_buffer_size=16) if threads else grain.ReadOptions(num_threads=0)
    ds = ds.to_iter_dataset(options, allow_nones=nones)
    for i, spec in enumerate(specs.split()):
        ds = _stage(ds, i, spec)
    if nones:
        ds = ds.filter(lambda e: e is not None)
    batch_fn = None
    if batch_fails_at is not None:

        def batch_fn(elements):
            for e in elements:
                _fails("batch", batch_fails_at, _x(e), RuntimeError)
            return elements

    return ds.batch(7, batch_fn=batch_fn)


def _run_all(it, steps=200):
    """Like ``_run``, on an iterator, recording KeyboardInterrupt too."""
    out = [it.get_state()]
    for _ in range(steps):
        try:
            out.append(_plain(next(it)))
        except StopIteration:
            out.append("stop")
            break
        except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - the error is what is compared
            out.append(("error", type(e).__name__, str(e), list(getattr(e, "__notes__", []))))
        out.append(it.get_state())
    return out


_COUNTED_CASES = {
    # (stages below the batch, from the reading up; where the batch fails)
    "random_map": ("R", None),
    "map_with_index": ("I", None),
    "filters_below_and_above": ("F R F I F", None),
    "two_random_maps": ("R R", None),
    "random_map_then_map_with_index": ("R I", None),
    "map_with_index_then_random_map": ("F I R F", None),
    "fails_in_random_map": ("R!100", None),
    "fails_in_map_with_index": ("F I!101 F", None),
    "fails_in_the_second_counting_stage": ("R I!150", None),
    "fails_in_the_first_counting_stage": ("F R!152 I F", None),
    "fails_in_a_map_above": ("R I M!130", None),
    "fails_in_a_map_above_a_filter": ("F I R F M!200", None),
    "fails_in_a_filter_above": ("R F I F!140", None),
    "fails_in_a_map_below": ("M!90 R I", None),
    "fails_in_a_filter_below": ("F!88 I F R", None),
    "fails_in_every_stage": ("M!40 F!70 R!100 I!130 F!160 M!191", None),
    "fails_in_the_batch": ("F R I F", 120),
    "interrupted_above": ("F R I K!110", None),
}


@pytest.mark.parametrize("threads", [False, True])
@pytest.mark.parametrize("case", sorted(_COUNTED_CASES))
def test_counting_stages_take_chunks_with_the_states_of_one_element_at_a_time(threads, case):
    specs, batch_fails_at = _COUNTED_CASES[case]
    ds = _counted(specs, threads, batch_fails_at)
    it = ds.__iter__()
    counting = {"R": "_RandomMapChunksIterator", "I": "_MapWithIndexChunksIterator"}
    names, node = [], it
    while node is not None:
        names.append(type(node).__name__)
        node = node._parents[0] if node._parents else None
    assert it._take is not None
    assert [n for n in names if "Random" in n or "Index" in n] == [
        counting[s[0]] for s in reversed(specs.split()) if s[0] in counting
    ]
    chunked = _run_all(it)
    with _one_at_a_time():
        expected = _run_all(_counted(specs, threads, batch_fails_at).__iter__())
    assert chunked == expected
    assert chunked[-1] == "stop"
    errors = [o for o in chunked if isinstance(o, tuple)]
    assert bool(errors) == ("!" in specs or batch_fails_at is not None)
    # Each state restores to the same continuation: outputs, rng draws, errors and states.
    states = chunked[0::2]
    for step, state in enumerate(states[:-1]):
        restored = _counted(specs, threads, batch_fails_at).__iter__()
        restored.set_state(state)
        assert _run_all(restored) == chunked[2 * step :], f"restored at step {step}: {state}"


@pytest.mark.parametrize("threads", [False, True])
def test_counting_stages_count_the_nones_they_pass_as_one_element_at_a_time(threads):
    chunked = _run_all(_counted("R F I!78 M!123", threads, nones=True).__iter__())
    with _one_at_a_time():
        expected = _run_all(_counted("R F I!78 M!123", threads, nones=True).__iter__())
    assert chunked == expected
    assert chunked[-1] == "stop"
    assert [o[1] for o in chunked if isinstance(o, tuple)] == ["ValueError", "ValueError"]


def test_a_filter_dropping_too_many_above_a_counting_stage_recounts_it():
    def build():
        ds = grain.MapDataset.range(2500).to_iter_dataset(grain.ReadOptions(num_threads=0))
        # (A filter below, so the windows of the one above end inside the chunks.)
        ds = ds.filter(lambda x: x % 10 != 3).random_map(lambda x, rng: x + int(rng.integers(2)) * 10_000, seed=3)
        ds = ds.map_with_index(lambda i, x: x).filter(lambda x: x % 5 < 2).batch(64)
        return grain.experimental.WithOptionsIterDataset(ds, grain.experimental.DatasetOptions(filter_raise_threshold_ratio=0.5))

    chunked = _run_all(build().__iter__(), steps=1000)
    with _one_at_a_time():
        expected = _run_all(build().__iter__(), steps=1000)
    assert chunked == expected
    errors = [o for o in chunked if isinstance(o, tuple)]
    assert errors and all(e[1] == "ValueError" and "skipped" in e[2] for e in errors)


@pytest.mark.parametrize("threads", [False, True])
def test_counting_stages_over_records_with_metadata_columns_get_whole_records(threads):
    from grainlike.loader.records import SamplerMapDataset

    def build():
        sampler = grain.IndexSampler(300, grain.NoSharding(), shuffle=True, num_epochs=1, seed=0)
        records = SamplerMapDataset(grain.RangeDataSource(0, 300, 1), sampler, grain.NoSharding())
        ds = records.to_iter_dataset(grain.ReadOptions(num_threads=2 if threads else 0))

        def draw(record, rng):
            _fails("random_map", 77, record.data)
            return (record.metadata.record_key, record.data, int(rng.integers(1000)))

        ds = ds.random_map(draw, seed=1).map_with_index(lambda i, e: (i, *e)).filter(lambda e: e[2] % 3 != 1)
        return ds.map(lambda e: _fails("map", 200, e[2]) or e).batch(7, batch_fn=list)

    chunked = _run_all(build().__iter__())
    with _one_at_a_time():
        expected = _run_all(build().__iter__())
    assert chunked == expected
    assert chunked[-1] == "stop"
    assert sorted(o[2] for o in chunked if isinstance(o, tuple)) == ["map failed at 200", "random_map failed at 77"]
