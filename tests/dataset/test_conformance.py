"""assert_equal_output_after_checkpoint: passes where grain's does, fails where it must."""

from __future__ import annotations

import pytest

import grainlike as grain
from grainlike.dataset import MapDataset
from grainlike.dataset.conformance import assert_equal_output_after_checkpoint


@pytest.fixture(scope="module")
def grain_ref():
    import absl.flags

    absl.flags.FLAGS.mark_as_parsed()
    import grain.python as grain_ref

    return grain_ref


@pytest.fixture(scope="module")
def grains_check(grain_ref):
    from grain._src.python.testing.experimental import assert_equal_output_after_checkpoint as check

    return check


class Counter:
    """An iterable of ``range(n)`` with dict states; ``bug`` breaks one thing."""

    def __init__(self, n=5, bug=None):
        self.n, self.bug = n, bug
        self.closed = 0

    def __iter__(self):
        return CounterIterator(self)


class CounterIterator:
    def __init__(self, ds):
        self.ds, self.i = ds, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.ds.n:
            raise StopIteration
        self.i += 1
        return {"value": self.i - 1}

    def get_state(self):
        if self.ds.bug == "state_grows" and self.i == 3:
            return {"i": self.i, "extra": [1]}
        if self.ds.bug == "state_after_restore" and getattr(self, "restored", False):
            return {"i": self.i, "restored": 1} if self.i > self.restored_at else {"i": self.i}
        return {"i": self.i}

    def set_state(self, state):
        self.i = state["i"] + (1 if self.ds.bug == "skips_one" and state["i"] else 0)
        if self.ds.bug == "state_after_restore":
            self.restored, self.restored_at = True, self.i

    def close(self):
        self.ds.closed += 1


def test_passes_on_a_correct_iterable_and_closes_every_iterator():
    ds = Counter(5)
    assert_equal_output_after_checkpoint(ds)
    assert ds.closed == 1 + 5  # the recorded run and one restore per step


@pytest.mark.parametrize(
    "bug, fragment",
    [
        ("skips_one", "Restored state does not match"),
        ("state_grows", "State spec does not match the original state spec at step 3"),
        ("state_after_restore", "After restoring the state of step 0, the state after step 0 differs"),
    ],
)
def test_fails_with_assertion_error_naming_the_step(bug, fragment):
    ds = Counter(5, bug)
    with pytest.raises(AssertionError, match=fragment):
        assert_equal_output_after_checkpoint(ds)
    assert ds.closed >= 1


@pytest.mark.parametrize("bug", ["skips_one", "state_grows"])
def test_grain_rejects_the_same_broken_iterators(grains_check, bug):
    with pytest.raises(AssertionError):
        grains_check(Counter(5, bug))
    grains_check(Counter(5))


def test_empty_dataset_and_iterators_without_state_are_refused():
    with pytest.raises(AssertionError, match="did not produce any elements"):
        assert_equal_output_after_checkpoint(Counter(0))
    with pytest.raises(TypeError, match="has no get_state"):
        assert_equal_output_after_checkpoint([1, 2, 3])


def test_checks_grains_own_datasets_and_grain_checks_grainlikes(grain_ref, grains_check):
    theirs = grain_ref.MapDataset.range(9).shuffle(seed=3).map(lambda x: x + 1).to_iter_dataset().batch(2)
    assert_equal_output_after_checkpoint(theirs)
    ours = MapDataset.range(9).shuffle(seed=3).map(lambda x: x + 1).to_iter_dataset().batch(2)
    grains_check(ours)


def test_a_dataloaders_json_state_is_checked_field_by_field():
    # The spec of a DataLoader state is that of the JSON object, not of the bytes.
    from grainlike.dataset.conformance import _spec

    loader = grain.DataLoader(
        data_source=list(range(4)),
        sampler=grain.IndexSampler(4, grain.NoSharding(), num_epochs=1, seed=0),
    )
    spec = _spec(iter(loader).get_state())
    assert spec["last_seen_indices"] == {"0": "int[]"} and spec["sampler"] == "str[]"
