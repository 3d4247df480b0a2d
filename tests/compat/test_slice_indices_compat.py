"""``MapDataset.slice`` with indices (grain's main branch) against grain 0.2.18's stages.

grain 0.2.18 has no ``ReindexMapDataset``; grain's main branch defines its element
``i`` as ``parent[indices[i % n] + (i // n) * len(parent)]``. On grain's side of
each comparison that rule is ``_Gather``, a minimal MapDataset written here over
grain 0.2.18's parent, and everything around it (sources, shuffles, random maps,
repeat, ``to_iter_dataset``, batch, filters) is grain 0.2.18's: the elements, their
types and the states must be the same at every step, and each library's states
restore in the other. The grainlike-only tests, with grain main's own expected
values, are in tests/dataset/test_slice_indices.py.
"""

import numpy as np
import pytest

from tests.compat.dataset_pairs import GRAINLIKE, assert_same, check_pipeline, grain_namespace, run


@pytest.fixture(scope="module")
def G(grain_ref):
    return grain_namespace(grain_ref)


def _slice(lib, parent, indices):
    """``parent.slice(indices)``: grainlike's method; on grain 0.2.18 the rule, as ``_Gather``."""
    if lib is GRAINLIKE:
        return parent.slice(indices)
    return _gather_class(lib)(parent, indices)


_GATHER = {}


def _gather_class(lib):
    if lib.name not in _GATHER:

        class _Gather(lib.MapDataset):
            def __init__(self, parent, indices):
                super().__init__(parent)
                self._indices = indices

            def __len__(self):
                return len(self._indices)

            def __getitem__(self, index):
                n = len(self._indices)
                return self._parent[self._indices[index % n] + (index // n) * len(self._parent)]

        _GATHER[lib.name] = _Gather
    return _GATHER[lib.name]


def _indices(lib, kind):
    if kind == "list":
        return [7, 2, 2, 9, 0, 13, 4]
    if kind == "numpy":
        return np.array([5, 1, 8, 8, 3], dtype=np.int64)
    if kind == "map_dataset":
        return lib.MapDataset.range(11)[::-3]  # 10, 7, 4, 1
    raise ValueError(kind)


PARENTS = {
    "range": lambda lib: lib.MapDataset.range(11),
    "source": lambda lib: lib.MapDataset.source([f"r{i}" for i in range(11)]),
    "shuffle": lambda lib: lib.MapDataset.range(11).shuffle(seed=4),
    "random_map": lambda lib: lib.MapDataset.range(11).random_map(lambda x, rng: (x, int(rng.integers(1000))), seed=8),
    "map_with_index": lambda lib: lib.MapDataset.range(11).map_with_index(lambda i, x: (i, x)),
    "filter": lambda lib: lib.MapDataset.range(11).filter(lambda x: x % 3 != 2),
}


@pytest.mark.parametrize("kind", ["list", "numpy", "map_dataset"])
@pytest.mark.parametrize("parent", sorted(PARENTS))
def test_elements_by_index_are_grains_rule(G, parent, kind):
    mine = PARENTS[parent](GRAINLIKE).slice(_indices(GRAINLIKE, kind))
    ref_parent = PARENTS[parent](G)
    ref = _indices(G, kind)
    n = len(ref)
    assert len(mine) == n
    for i in range(3 * n):
        expected = ref_parent[ref[i % n] + (i // n) * len(ref_parent)]
        assert_same(expected, mine[i], f"[{i}]")
    positions = [0, 2 * n - 1, 1, n, 3 * n - 2]
    chunk = list(mine._getitems(positions))
    if parent == "shuffle" and kind == "numpy":
        # grainlike's ShuffleMapDataset._getitems computes its parent's indices
        # as Python ints where grain's keeps numpy ints numpy: range's elements
        # read through it are ints here, np.int64 in grain (same values).
        assert chunk == [mine[i] for i in positions]
    else:
        assert_same([mine[i] for i in positions], chunk, "_getitems")


@pytest.mark.parametrize("kind", ["list", "numpy", "map_dataset"])
@pytest.mark.parametrize(
    "pipeline",
    [
        lambda lib, p: p.to_iter_dataset(),
        lambda lib, p: p.repeat(2).to_iter_dataset().batch(3),
        lambda lib, p: p.repeat(3).to_iter_dataset().filter(lambda x: int(np.sum(np.asarray(x, dtype=object) == 0)) == 0),
    ],
    ids=["iter", "repeat-batch", "repeat-filter"],
)
@pytest.mark.parametrize("parent", ["range", "shuffle", "random_map", "filter"])
def test_pipelines_match_with_the_same_states(G, parent, kind, pipeline):
    def build(lib):
        return pipeline(lib, _slice(lib, PARENTS[parent](lib), _indices(lib, kind)))

    if parent == "shuffle" and kind == "numpy":
        # The element types differ there (see test_elements_by_index_are_grains_rule):
        # the same values and states.
        g_values, g_states = run(build(G))
        l_values, l_states = run(build(GRAINLIKE))
        assert [np.asarray(v).tolist() for v in l_values] == [np.asarray(v).tolist() for v in g_values]
        assert l_states == g_states and l_values
        return
    assert check_pipeline(build, G)


@pytest.mark.parametrize("sl", [slice(2, 9, 3), slice(None, None, -2), slice(-4, None), slice(30, 40)])
def test_a_slice_object_is_as_in_grain(G, sl):
    def build(lib):
        return lib.MapDataset.range(11).shuffle(seed=1).slice(sl).repeat(2).to_iter_dataset()

    check_pipeline(build, G)
    assert str(GRAINLIKE.MapDataset.range(11).slice(sl)) == str(G.MapDataset.range(11).slice(sl))
