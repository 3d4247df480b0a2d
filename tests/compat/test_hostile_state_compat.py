"""Hostile states against grain 0.2.18: grainlike refuses them as a subclass of what grain raises.

grain fails on a state nested 100,000 levels deep with a ``KeyError`` (a key it
needs is missing), a ``TypeError`` (nesting where a number belongs) or a
``RecursionError``. grainlike raises ``InvalidStateError`` every time, and where
grain raises something specific (not a ``RecursionError``), an instance of it too.
"""

from __future__ import annotations

import pytest

from grainlike import InvalidStateError
from tests.compat.dataset_pairs import GRAINLIKE, grain_namespace

DEEP = 100_000


@pytest.fixture(scope="module")
def G(grain_ref):
    return grain_namespace(grain_ref)


def _deep(depth: int, make) -> object:
    state = 0
    for _ in range(depth):
        state = make(state)
    return state


PIPELINES = {
    "range": lambda lib: lib.MapDataset.range(10).to_iter_dataset(),
    "map_shuffle": lambda lib: lib.MapDataset.range(10).shuffle(seed=1).map(lambda x: x + 1).to_iter_dataset(),
    "batch": lambda lib: lib.MapDataset.range(10).to_iter_dataset().batch(3),
    "mix": lambda lib: lib.IterDataset.mix([lib.MapDataset.range(10).to_iter_dataset()] * 2, [0.5, 0.5]),
    "window_shuffle": lambda lib: lib.WindowShuffleIterDataset(lib.MapDataset.range(10).to_iter_dataset(), window_size=3, seed=1),
    "zip": lambda lib: lib.ZipIterDataset([lib.MapDataset.range(10).to_iter_dataset()] * 2),
    "repeat": lambda lib: lib.RepeatIterDataset(lib.MapDataset.range(10).to_iter_dataset(), num_epochs=2),
}

HOSTILE = {
    "deep_dict": lambda state: _deep(DEEP, lambda s: {"a": s}),
    "deep_list": lambda state: _deep(DEEP, lambda s: [s]),
    "deep_dict_under_every_key": lambda state: {k: _deep(DEEP, lambda s: {"a": s}) for k in state},
    "deep_list_under_every_key": lambda state: {k: _deep(DEEP, lambda s: [s]) for k in state},
}


def _error_of(lib, pipeline: str, hostile: str) -> BaseException:
    it = iter(PIPELINES[pipeline](lib))
    next(it)
    bad = HOSTILE[hostile](it.get_state())
    try:
        it.set_state(bad)
    except Exception as e:  # RecursionError included
        return e
    raise AssertionError(f"{lib.name if hasattr(lib, 'name') else lib}: {pipeline} accepted {hostile}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hostile", sorted(HOSTILE))
@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_a_hostile_state_is_refused_as_a_subclass_of_what_grain_raises(G, pipeline, hostile):
    theirs = _error_of(G, pipeline, hostile)
    ours = _error_of(GRAINLIKE, pipeline, hostile)
    assert isinstance(ours, InvalidStateError), repr(ours)[:300]
    if not isinstance(theirs, RecursionError):
        assert isinstance(ours, type(theirs)), (type(theirs), type(ours))
