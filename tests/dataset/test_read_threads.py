"""What ``to_iter_dataset()`` without ReadOptions runs in threads (grainlike/dataset/transformations/read_threads.py).

Work that waits (sources of unknown types, remote files, user maps) runs in
grain's 16 read threads; work known to be local and CPU-bound in the calling
thread. Either way the elements, their order and the states are those of a run
in one thread.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import threading

import numpy as np
import pytest

import grainlike
from grainlike import MapDataset, MultiprocessingOptions, ReadOptions
from grainlike.sources import InMemoryDataSource, RangeDataSource
from tests.helpers import waiting

pytestmark = pytest.mark.timeout(120)


class LocalMap(grainlike.MapTransform):
    waits = False

    def map(self, x):
        return x + 1


class FetchMap(grainlike.MapTransform):
    waits = True

    def map(self, x):
        return x


def local_fn(x):
    return x * 2


local_fn.waits = False


class UserSource:
    def __len__(self):
        return 8

    def __getitem__(self, key):
        return key


class LocalUserSource(UserSource):
    waits = False


class UserMapDataset(MapDataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return index


class SplitTwo(grainlike.experimental.FlatMapTransform):
    max_fan_out = 2

    def flat_map(self, x):
        return [x, x]


def _read_threads_seen(ds) -> set:
    from tests.helpers.threads import new_read_threads, read_threads

    seen, before = set(), read_threads()
    for _ in ds:
        seen |= new_read_threads(before)
    return seen


LOCAL = {
    "range": lambda: MapDataset.range(40),
    "structural stages": lambda: MapDataset.range(40).seed(1).shuffle().slice(slice(1, None, 2)).repeat(2).batch(3),
    "list": lambda: MapDataset.source(list(range(40))),
    "numpy": lambda: MapDataset.source(np.arange(40)),
    "RangeDataSource": lambda: MapDataset.source(RangeDataSource(0, 40, 1)).shuffle(seed=3),
    "InMemoryDataSource": lambda: MapDataset.source(InMemoryDataSource(list(range(40)))),
    "concatenate and mix": lambda: MapDataset.concatenate([MapDataset.range(5), MapDataset.mix([MapDataset.range(4), MapDataset.source([7, 8])])]),
    "zip": lambda: grainlike.experimental.ZipMapDataset([MapDataset.range(5), MapDataset.source(np.arange(5))]),
    "window shuffle": lambda: grainlike.experimental.WindowShuffleMapDataset(MapDataset.range(40), window_size=8, seed=0),
    "a MapDataset as source": lambda: MapDataset.source(MapDataset.range(6).shuffle(seed=0)),
    "map declaring waits=False": lambda: MapDataset.range(40).map(LocalMap()),
    "function declaring waits=False": lambda: MapDataset.range(40).map(local_fn).filter(local_fn),
    "user source declaring waits=False": lambda: MapDataset.source(LocalUserSource()),
}

WAITING = {
    "user map": lambda: MapDataset.range(8).map(lambda x: x),
    "user filter": lambda: MapDataset.range(8).filter(lambda x: x > 2),
    "user random map": lambda: MapDataset.range(8).random_map(lambda x, rng: x, seed=1),
    "user map with index": lambda: MapDataset.range(8).map_with_index(lambda i, x: x),
    "user flat map": lambda: MapDataset.range(8).apply(SplitTwo()),
    "user batch_fn": lambda: MapDataset.range(8).batch(2, batch_fn=list),
    "map declaring waits=True": lambda: MapDataset.range(8).map(FetchMap()),
    "user source": lambda: MapDataset.source(UserSource()).shuffle(seed=0),
    "user source under a MapDataset source": lambda: MapDataset.source(MapDataset.source(UserSource())),
    "user MapDataset": lambda: UserMapDataset().slice(slice(0, 4)),
    "one waiting parent of many": lambda: MapDataset.concatenate([MapDataset.range(3), MapDataset.source(UserSource())]),
}


@pytest.mark.parametrize("name", LOCAL)
def test_work_known_to_be_local_reads_in_the_calling_thread(name):
    ds = LOCAL[name]().to_iter_dataset()
    assert ds.read_threads() == 0
    assert _read_threads_seen(ds) == set()


@pytest.mark.parametrize("name", WAITING)
def test_work_that_waits_or_is_unknown_reads_in_grains_16_threads(name):
    ds = WAITING[name]().to_iter_dataset()
    assert ds.read_threads() == 16
    assert list(ds) == list(WAITING[name]().to_iter_dataset(ReadOptions(num_threads=0)))


def test_explicit_read_options_are_used_as_given():
    assert MapDataset.range(8).map(LocalMap()).to_iter_dataset(ReadOptions(num_threads=2)).read_threads() == 2
    assert MapDataset.source([1, 2]).to_iter_dataset(ReadOptions()).read_threads() == 16
    assert MapDataset.source(UserSource()).to_iter_dataset(ReadOptions(num_threads=0)).read_threads() == 0
    no_buffer = ReadOptions(num_threads=4, prefetch_buffer_size=0)
    assert MapDataset.source(UserSource()).to_iter_dataset(no_buffer).read_threads() == 0


def test_a_declaration_that_is_not_a_bool_is_named():
    class Vague(grainlike.MapTransform):
        waits = "sometimes"

        def map(self, x):
            return x

    with pytest.raises(TypeError, match=r"Vague.waits must be True .* or False .* got 'sometimes'"):
        MapDataset.range(3).map(Vague()).to_iter_dataset().read_threads()


def _grainlike_map_dataset_types() -> set:
    for package in (grainlike.dataset, grainlike.loader):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            importlib.import_module(module.name)
    found, to_visit = set(), [MapDataset]
    while to_visit:
        for sub in to_visit.pop().__subclasses__():
            to_visit.append(sub)
            if sub.__module__.startswith("grainlike."):
                found.add(sub)
    return found


def test_every_grainlike_map_dataset_type_says_whether_its_own_work_waits():
    # A new stage must say whether the work it does itself waits: by overriding
    # MapDataset._own_work_waits, or by declaring ``waits``.
    types = _grainlike_map_dataset_types()
    assert {"RangeMapDataset", "BatchMapDataset", "MapMapDataset"} <= {t.__name__ for t in types}
    unclassified = [
        f"{t.__module__}.{t.__qualname__}"
        for t in types
        if t._own_work_waits is MapDataset._own_work_waits
        and not isinstance(inspect.getattr_static(t, "waits", None), bool)
    ]
    assert not unclassified, f"say whether their own work waits (_own_work_waits): {unclassified}"


N = 128


def _run(ds) -> tuple[list, list]:
    it = iter(ds)
    outputs, states = [], []
    for x in it:
        outputs.append(x)
        states.append(it.get_state())
    return outputs, states


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("what", ["map", "source"])
def test_waiting_work_overlaps_with_the_elements_and_states_of_one_thread(what, workers):
    def pipeline(delay, read_options=None):
        if what == "map":
            ds = MapDataset.range(N).map(waiting.WaitingMap(delay))
        else:
            ds = MapDataset.source(waiting.WaitingSource(N, delay))
        ds = ds.shuffle(seed=4).to_iter_dataset(read_options)
        if workers:
            ds = ds.mp_prefetch(MultiprocessingOptions(num_workers=workers))
        return ds

    waiting.reset()
    threaded, threaded_states = _run(pipeline(0.01))
    waiting.reset()
    one_thread, one_thread_states = _run(pipeline(0, ReadOptions(num_threads=0)))
    field = "x" if what == "map" else "key"
    assert waiting.keys(threaded, field) == waiting.keys(one_thread, field)
    assert sorted(waiting.keys(threaded, field)) == list(range(N))
    assert threaded_states == one_thread_states
    # Each process's 10 ms sleeps overlapped: grain's 16 threads, not one.
    assert waiting.max_overlap(threaded) >= 4
    assert waiting.max_overlap(one_thread) == 1
