"""Exceptions that cannot be printed or pickled, and outputs that cannot be pickled.

Each reaches the user as its own type (or WorkerError when not even the type can
be rebuilt), with what can be recovered of its message and the note naming the
transform, and never hangs.
"""

import pickle
import traceback

import pytest

import grainlike as grain
from grainlike.dataset.base import MapDataset
from grainlike.dataset.nodes.options import MultiprocessingOptions
from grainlike.core.errors import WorkerError
from tests.reliability import transforms
from tests.reliability.transforms import RaiseAt, UnpicklableOutputAt

pytestmark = pytest.mark.timeout(60)


def _dataset(transform, workers):
    ds = MapDataset.range(8).to_iter_dataset().map(transform)
    if workers:
        ds = ds.mp_prefetch(MultiprocessingOptions(num_workers=workers, stall_timeout_s=20))
    return ds


def _loader(transform, workers):
    return grain.DataLoader(
        data_source=list(range(8)),
        sampler=grain.IndexSampler(8, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
        operations=[transform],
        worker_count=workers,
    )


def _error_of(iterable):
    it = iter(iterable)
    try:
        with pytest.raises(BaseException) as info:
            for _ in it:
                pass
    finally:
        it.close()
    return info.value


# kind -> (type the user gets, its str() or None where str() itself fails)
_CASES = {
    "str_fails": (transforms.StrFails, None),
    "holds_lock": (transforms.HoldsLock, "held lock message"),
    "needs_two": (transforms.NeedsTwo, "1-2"),
    "str_fails_holds_lock": (transforms.StrFailsHoldsLock, None),
    "unsendable_type": (WorkerError, "tests.reliability.transforms._unsendable_type.<locals>.Local: local message"),
}


@pytest.mark.parametrize("kind", sorted(_CASES))
@pytest.mark.parametrize("face", ["dataset", "loader"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_broken_exception_reaches_the_user_with_its_type_and_the_transform(no_leaks, kind, face, workers):
    error = _error_of((_dataset if face == "dataset" else _loader)(RaiseAt(kind), workers))
    expected_type, expected_text = _CASES[kind]
    if workers == 0 and expected_type is WorkerError:
        expected_type = Exception  # in process it is raised as itself
    assert isinstance(error, expected_type), repr(type(error))
    if expected_text is not None and not (workers == 0 and kind == "unsendable_type"):
        assert str(error) == expected_text
    notes = "\n".join(error.__notes__)
    assert "RaiseAt" in notes  # the transform that raised
    if workers:
        assert "raised in worker 1" in notes
        # The worker's frames, down to the transform that raised, end the traceback.
        frames = traceback.extract_tb(error.__traceback__)
        assert (frames[-1].filename, frames[-1].name) == (transforms.__file__, "map"), frames
    if workers and kind in ("str_fails_holds_lock",):
        # Not printable: the message is recovered from the exception's args.
        assert "its args: ('hidden too',)" in notes


@pytest.mark.parametrize("kind", ["lock", "main_class"])
@pytest.mark.parametrize("face", ["dataset", "loader"])
def test_an_output_that_cannot_be_pickled_names_its_leaf_and_the_rule(no_leaks, kind, face):
    error = _error_of((_dataset if face == "dataset" else _loader)(UnpicklableOutputAt(kind), 2))
    # What pickle raises for it, as grain's workers would.
    assert isinstance(error, (TypeError, pickle.PicklingError, AttributeError)), repr(error)
    notes = "\n".join(error.__notes__)
    assert "a worker's output cannot be sent to the consumer" in notes
    assert "the leaf at ['extra']" in notes
    assert "Outputs crossing processes must be picklable" in notes
    if kind == "main_class":
        assert "__main__.Point" in notes and "define it in a module" in notes
    assert "UnpicklableOutputAt" in notes  # the transform that made the output
    assert "raised in worker 1" in notes


def test_outputs_before_an_unpicklable_one_are_delivered(no_leaks):
    it = iter(_dataset(UnpicklableOutputAt("lock"), 2))
    got = []
    with pytest.raises(TypeError):
        for x in it:
            got.append(int(x["x"]))
    assert got == [0, 1, 2]
    # mp_prefetch: that worker counts as exhausted; the other goes on.
    assert [int(x["x"]) for x in it] == [4, 6]
    it.close()
