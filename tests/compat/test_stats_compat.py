"""grain's per-stage statistics interface (``grain._src.python.dataset.stats``) on grainlike.

Stages written for grain use ``self._stats`` of their ``MapDataset`` or
``DatasetIterator`` and decorate ``__next__`` with
``stats.record_next_duration_if_output`` (crossformer's window datasets,
xlstm-jax's batch ramp-up); grainlike's recorder records nothing, and every
call returns what grain's default recorder returns.
"""

from __future__ import annotations

import dataclasses
import importlib
import pickle
import time

import pytest


@pytest.fixture(scope="module")
def libs(grain_ref):
    """(the library as ``grain`` is used, its stats module), for grain then grainlike."""
    import grainlike

    grain_stats = importlib.import_module("grain._src.python.dataset.stats")
    ours = importlib.import_module("grainlike._src.python.dataset.stats")
    return [(grain_ref, grain_stats), (grainlike, ours)]


def _custom_stages(lib, stats):
    """A window-sum MapDataset and a pairing IterDataset, written as projects write them for grain."""

    class WindowSumMapDataset(lib.MapDataset):
        def __init__(self, parent, size):
            super().__init__(parent)
            self._size = size

        def __len__(self):
            return len(self._parent)

        def __str__(self):
            return "WindowSumMapDataset"

        def __getitem__(self, index):
            if isinstance(index, slice):
                return self.slice(index)
            with self._stats.record_self_time():
                n = len(self._parent)
                window = [self._parent[i % n] for i in range(index, index + self._size)]
                return self._stats.record_output_spec(int(sum(window)))

    class _PairIterator(lib.DatasetIterator):
        @stats.record_next_duration_if_output
        @stats.trace_input_pipeline_next(stage_category=stats.IPL_CAT_PREPROCESSING)
        def __next__(self):
            with self._stats.record_self_time(num_elements=2):
                pair = (next(self._parent), next(self._parent))
            return self._stats.record_output_spec(pair)

        def get_state(self):
            return self._parent.get_state()

        def set_state(self, state):
            self._parent.set_state(state)

        def __str__(self):
            return "PairIterator"

    class PairIterDataset(lib.IterDataset):
        def __iter__(self):
            return _PairIterator(self._parent.__iter__())

    return WindowSumMapDataset, PairIterDataset


def test_stages_using_stats_give_grains_elements_and_states(libs):
    runs = []
    for lib, stats in libs:
        window_sum, pairs = _custom_stages(lib, stats)
        ds = window_sum(lib.MapDataset.range(10).shuffle(seed=3), 3)
        it = iter(pairs(ds.to_iter_dataset()))
        head = [next(it) for _ in range(2)]
        state = it.get_state()
        rest = list(it)
        it.set_state(state)
        runs.append((list(ds), head, state, rest, list(it)))
    assert runs[0] == runs[1]
    assert runs[1][3] == runs[1][4]


def test_every_dataset_and_iterator_has_grains_default_recorder(libs):
    for lib, stats in libs:
        parent = lib.MapDataset.range(4)
        ds = parent.map(lambda x: x + 1)
        it = iter(ds.to_iter_dataset())
        for node in (ds, it):
            recorder = node._stats
            assert isinstance(recorder, stats.Stats)
            assert recorder is node._stats  # made once
            assert recorder._config.name == str(node)
            assert recorder._config.iter_weakref() is node
            assert recorder._is_output and recorder.output_spec is None
        assert not parent._stats._is_output  # the mapped dataset reads from it
        element = {"a": 1}
        assert ds._stats.record_output_spec(element) is element
        assert ds._stats.output_spec is None  # the default recorder keeps no spec
        assert list(it) == [1, 2, 3, 4]


def test_make_stats_trees_behave_as_grains(libs):
    observed = []
    for _, stats in libs:
        leaves = [stats.make_stats(stats.StatsConfig(name=n), []) for n in ("left", "right")]
        root = stats.make_stats(stats.StatsConfig(name="root", transform_mutates_spec=False), leaves)
        with root.record_self_time(num_elements=3, offset_ns=5):
            pass
        element, batch = [1, 2], [None, (1, 2)]
        observed.append((
            isinstance(root, stats.Stats),
            root._is_output,
            [leaf._is_output for leaf in leaves],
            root.record_output_spec(element) is element,
            root.record_output_spec_for_batch(batch) is batch,
            root.record_output_spec_for_batch([]),
            root.record_bytes_consumed(element) is element,
            root.record_bytes_produced(element) is element,
            root.output_spec,
            leaves[0].output_spec,
            root.report(),
            root._config.is_prefetch,
            stats.StatsConfig(name="p", node_type=stats.NodeType.PREFETCH).is_prefetch,
        ))
    assert observed[0] == observed[1]
    assert observed[1][:5] == (True, True, [False, False], True, True)


def test_stats_config_is_grains(libs):
    (_, theirs), (_, ours) = libs

    def fields(stats):
        out = []
        for f in dataclasses.fields(stats.StatsConfig):
            default = f.default.name if isinstance(f.default, stats.NodeType) else f.default
            out.append((f.name, repr(default), f.kw_only))
        return out

    assert fields(ours) == fields(theirs)
    with pytest.raises(TypeError):
        ours.StatsConfig("positional")  # keyword-only, as grain's
    for _, stats in libs:
        config = stats.StatsConfig(name="x", iter_weakref=stats.HashableWeakRef(stats))
        copy = pickle.loads(pickle.dumps(config))
        assert copy.iter_weakref is None and copy.name == "x"  # the weak reference is dropped


def test_node_types_and_stage_categories_are_grains(libs):
    (_, theirs), (_, ours) = libs
    assert [(m.name, m.value) for m in ours.NodeType] == [(m.name, m.value) for m in theirs.NodeType]
    for name in ("IPL_CAT_PREPROCESSING", "IPL_CAT_READ", "IPL_CAT_ENQUEUE", "IPL_CAT_UNKNOWN", "IPL_CAT_PREFETCH"):
        assert getattr(ours, name) == getattr(theirs, name), name


def test_timer_adds_up_as_grains(libs):
    for _, stats in libs:
        timer = stats.Timer()
        assert timer.value() == 0
        with timer:
            time.sleep(0.01)
        first = timer.value()
        assert first >= 10_000_000
        with timer:
            time.sleep(0.01)
        assert timer.value() >= first + 10_000_000
        timer.reset()
        assert timer.value() == 0


def test_hashable_weak_ref_is_grains(libs):
    class Thing:
        pass

    for _, stats in libs:
        a, b = Thing(), Thing()
        ref = stats.HashableWeakRef(a)
        assert ref() is a and hash(ref) == id(a)
        assert ref == stats.HashableWeakRef(a) and ref != stats.HashableWeakRef(b) and ref != a
        assert len({ref, stats.HashableWeakRef(a)}) == 1
        del a
        assert ref() is None


def test_profiler_decorators_keep_what_they_decorate(libs):
    def read(stats_, parent, index):
        return (parent, index)

    calls = []
    for _, stats in libs:
        plain = stats.trace_input_pipeline(stats.IPL_CAT_READ, note=1)(lambda self, x: x * 2)
        nxt = stats.trace_input_pipeline_next()(lambda self: "next")
        prefetch = stats.trace_input_pipeline_prefetch(read)
        calls.append((plain(object(), 4), nxt(object()), prefetch(None, "parent", 3)))
    assert calls[0] == calls[1] == (8, "next", ("parent", 3))
