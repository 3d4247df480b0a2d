"""grain's legacy operations, TfRandomMap and FlatMap in the DataLoader, against grain 0.2.18.

``MapOperation``, ``RandomMapOperation``, ``FilterOperation``, ``BatchOperation``,
a user-written ``Operation``, a ``TfRandomMap`` and a ``FlatMapTransform`` (with 0
and 2 workers) give the same outputs, the same state bytes at every step and
restore across the two libraries.
"""

from __future__ import annotations

import numpy as np
import pytest

import grainlike
from tests.helpers.leaks import LeakCheck
from tests.helpers.pipelines import as_plain, take

pytestmark = pytest.mark.timeout(300)

N = 17


def _operations(lib, kind):
    """The operations of case ``kind``, built from ``lib``'s classes (by value, for workers)."""

    def double(x):
        return x * 2

    def not_multiple_of_3(x):
        return x % 3 != 0

    def add_noise(x, rng):
        return {"x": np.int64(x), "noise": rng.integers(0, 1000)}

    def pairs(records):
        # A user Operation: sums each two consecutive records, keeping the second's metadata.
        held = None
        for r in records:
            if held is None:
                held = r
            else:
                yield type(r)(r.metadata.remove_record_key(), held.data + r.data)
                held = None

    class Noise(lib.RandomMapTransform):
        def random_map(self, x, rng):
            return {"x": np.int64(x), "first": rng.integers(0, 1000)}

    transforms = grainlike.transforms if lib is grainlike else _grain_transforms()

    class TfNoise(transforms.TfRandomMap):
        def np_random_map(self, x, rng):
            return x + rng.integers(0, 1000)

    if kind == "legacy":
        return [lib.MapOperation(double), lib.FilterOperation(not_multiple_of_3),
                lib.RandomMapOperation(add_noise), lib.BatchOperation(3)]
    if kind == "shared_rng":
        # The operation draws from the generator the transform already drew from.
        def more_noise(x, rng):
            return {**x, "second": rng.integers(0, 1000)}

        return [Noise(), lib.RandomMapOperation(more_noise), lib.Batch(2)]
    if kind == "user_operation":
        return [lib.MapOperation(double), pairs, lib.BatchOperation(2, drop_remainder=True)]
    if kind == "tf_random_map":
        return [TfNoise(), lib.Batch(4)]
    raise ValueError(kind)


def _grain_transforms():
    import grain.transforms

    return grain.transforms


def _loader(lib, kind, worker_count=0):
    return lib.DataLoader(
        data_source=lib.RangeDataSource(0, N, 1),
        sampler=lib.IndexSampler(N, lib.NoSharding(), shuffle=True, num_epochs=2, seed=9),
        operations=_operations(lib, kind),
        worker_count=worker_count,
    )


def _run(it):
    """Every output with the state after it; the state before the first at [0]."""
    states, outputs = [it.get_state()], []
    for element in it:
        outputs.append(as_plain(element))
        states.append(it.get_state())
    return outputs, states


@pytest.mark.parametrize("kind", ["legacy", "shared_rng", "user_operation", "tf_random_map"])
def test_outputs_and_states_match_grain(grain_ref, kind):
    theirs, their_states = _run(iter(_loader(grain_ref, kind)))
    ours, our_states = _run(iter(_loader(grainlike, kind)))
    assert len(theirs) > 3
    assert ours == theirs
    assert our_states == their_states


@pytest.mark.parametrize("kind", ["legacy", "user_operation"])
def test_restores_across_libraries(grain_ref, kind):
    theirs, states = _run(iter(_loader(grain_ref, kind)))
    k = len(theirs) // 2
    ours = iter(_loader(grainlike, kind))
    ours.set_state(states[k])
    assert take(ours, 1000) == theirs[k:]
    ours = iter(_loader(grainlike, kind))
    take(ours, k)
    back = iter(_loader(grain_ref, kind))
    back.set_state(ours.get_state())
    assert take(back, 1000) == theirs[k:]


def test_legacy_operations_run_in_workers_as_in_grain(grain_ref):
    # Each worker applies the operations to its own records, as grain's workers do.
    expected, states = _run(iter(_loader(grain_ref, "legacy", worker_count=2)))
    leaks = LeakCheck()
    with iter(_loader(grainlike, "legacy", worker_count=2)) as it:
        assert _run(it) == (expected, states)
    leaks.assert_clean()


def _error(lib, ops, data):
    loader = lib.DataLoader(
        data_source=data,
        sampler=lib.SequentialSampler(len(data), lib.NoSharding()),
        operations=ops,
    )
    with pytest.raises(Exception) as info:
        list(loader)
    return info.value


@pytest.mark.parametrize(
    "make",
    [
        lambda lib: [lib.MapOperation(lambda x: 1 // (x - 2))],
        lambda lib: [lib.FilterOperation(lambda x: 1 // (x - 2))],
        lambda lib: [lib.RandomMapOperation(lambda x, rng: 1 // (x - 2))],
    ],
    ids=["map", "filter", "random_map"],
)
def test_an_error_in_an_operation_is_a_value_error_from_it(grain_ref, make):
    theirs = _error(grain_ref, make(grain_ref), list(range(5)))
    ours = _error(grainlike, make(grainlike), list(range(5)))
    assert isinstance(ours, type(theirs)) and isinstance(ours, ValueError)
    assert type(ours.__cause__) is type(theirs.__cause__) is ZeroDivisionError
    assert "global index 2" in str(ours)


def test_batch_operation_refuses_different_structures_as_grain(grain_ref):
    data = [{"a": np.int64(1)}, {"b": np.int64(2)}]
    theirs = _error(grain_ref, [grain_ref.BatchOperation(2)], data)
    ours = _error(grainlike, [grainlike.BatchOperation(2)], data)
    assert isinstance(ours, type(theirs)) and isinstance(ours, TypeError)
    # grain's message, then where each record differs.
    assert str(ours).startswith(str(theirs))
    assert "position 1: the structures differ: dict keys differ: ['a'] and ['b']" in str(ours)


def test_batch_operation_outside_a_loader_batches_records(grain_ref):
    def records(lib):
        return iter([lib.Record(lib.RecordMetadata(i, i), {"x": np.arange(2) + i}) for i in range(5)])

    theirs = list(grain_ref.BatchOperation(2)(records(grain_ref)))
    ours = list(grainlike.BatchOperation(2)(records(grainlike)))
    assert [repr(r.metadata) for r in ours] == [repr(r.metadata) for r in theirs]
    assert [r.data["x"].tolist() for r in ours] == [r.data["x"].tolist() for r in theirs]


def test_len_of_a_loader_with_an_operation_is_a_type_error_as_in_grain(grain_ref):
    with pytest.raises(TypeError):
        len(_loader(grain_ref, "legacy"))
    with pytest.raises(TypeError, match="legacy operation"):
        len(_loader(grainlike, "legacy"))


def _flat_map_loader(lib, worker_count, n=7):
    flat_map = lib.experimental.FlatMapTransform
    filter_t = lib.FilterTransform if lib is grainlike else _grain_transforms().Filter

    class Split(flat_map):
        max_fan_out = 3

        def flat_map(self, x):
            return [x * 10 + j for j in range(x % 3 + 1)]

    class SplitIndex(lib.RandomMapTransform):
        # After a flat map a record has no rng and the index of its split.
        def random_map(self, x, rng):
            return {"x": np.int64(x), "rng_is_none": rng is None}

    class DropSome(filter_t):
        def filter(self, x):
            return x["x"] % 7 != 3

    return lib.DataLoader(
        data_source=lib.RangeDataSource(0, n, 1),
        sampler=lib.IndexSampler(n, lib.NoSharding(), shuffle=True, num_epochs=2, seed=3),
        operations=[_double(lib), Split(), SplitIndex(), DropSome(), lib.Batch(2)],
        worker_count=worker_count,
    )


def _double(lib):
    class Double(lib.MapTransform):
        def map(self, x):
            return x * 2 + 1

    return Double()


@pytest.mark.parametrize("worker_count", [0, 2])
def test_flat_map_in_a_loader_matches_grain(grain_ref, worker_count):
    # grain splits each record before the operations after it and checkpoints
    # such a loader by its Dataset state: the same outputs and state bytes.
    theirs, their_states = _run(iter(_flat_map_loader(grain_ref, worker_count)))
    leaks = LeakCheck()
    with iter(_flat_map_loader(grainlike, worker_count)) as it:
        ours, our_states = _run(it)
    assert len(theirs) > 5
    assert ours == theirs
    assert our_states == their_states
    for k in (1, len(theirs) // 2):
        with iter(_flat_map_loader(grainlike, worker_count)) as it:
            it.set_state(their_states[k])
            assert take(it, 1000) == theirs[k:]
    leaks.assert_clean()
    if worker_count == 0:  # grain's workers are spawned processes (seconds each).
        back = iter(_flat_map_loader(grain_ref, worker_count))
        back.set_state(our_states[len(ours) // 2])
        assert take(back, 1000) == ours[len(ours) // 2 :]


@pytest.mark.parametrize("worker_count", [0, 2])
def test_flat_map_in_a_loader_restores_at_every_step(worker_count):
    leaks = LeakCheck()
    grainlike.experimental.assert_equal_output_after_checkpoint(_flat_map_loader(grainlike, worker_count, n=5))
    leaks.assert_clean()


def test_len_of_a_loader_with_a_flat_map_is_a_type_error_as_in_grain(grain_ref):
    def loader(lib):
        class Split(lib.experimental.FlatMapTransform):
            max_fan_out = 2

            def flat_map(self, x):
                return [x, x]

        return lib.DataLoader(
            data_source=[1, 2], sampler=lib.SequentialSampler(2, lib.NoSharding()), operations=[Split()]
        )

    with pytest.raises(TypeError):
        len(loader(grain_ref))
    with pytest.raises(TypeError, match="FlatMapTransform .*Split"):
        len(loader(grainlike))


def test_an_error_in_a_flat_map_keeps_its_type_as_grain(grain_ref):
    def ops(lib):
        class Fails(lib.experimental.FlatMapTransform):
            max_fan_out = 2

            def flat_map(self, x):
                return [x, 1 // (x - 2)]

        return [Fails()]

    theirs = _error(grain_ref, ops(grain_ref), list(range(4)))
    ours = _error(grainlike, ops(grainlike), list(range(4)))
    assert type(ours) is type(theirs) is ZeroDivisionError
    assert any("Fails" in note and "global index 2" in note for note in ours.__notes__)
