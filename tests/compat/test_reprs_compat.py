"""``repr``/``str`` of options, transforms and transform stages equal grain 0.2.18's.

Each case builds the same object in both libraries from the same constructor
arguments and compares the texts (printed side by side, so a failure shows
both). grainlike's extra information stays out of them: grainlike-only fields
are left out of the reprs, and where a transform was defined is named by
``describe()`` and by error messages, not by ``str()``.
"""

from __future__ import annotations

import functools
import inspect

import pytest

import grainlike


def double(x):
    return 2 * x


def _transforms(lib):
    class Plus(lib.transforms.Map):
        def map(self, x):
            return x + 1

    class Keep(lib.transforms.Filter):
        def filter(self, x):
            return x % 2 == 0

    class Jitter(lib.transforms.RandomMap):
        def random_map(self, x, rng):
            return x

    class Position(lib.transforms.MapWithIndex):
        def map_with_index(self, i, x):
            return x

    class Twice(lib.experimental.FlatMapTransform):
        max_fan_out = 2

        def flat_map(self, x):
            return [x, x]

    class Named(lib.transforms.Map):
        def map(self, x):
            return x

        def __repr__(self):
            return "Named(custom)"

    return Plus, Keep, Jitter, Position, Twice, Named


CASES = {
    "MultiprocessingOptions()": lambda lib: repr(lib.MultiprocessingOptions()),
    "MultiprocessingOptions(2, 3, True)": lambda lib: repr(lib.MultiprocessingOptions(2, 3, True)),
    "ReadOptions(num_threads=4)": lambda lib: repr(lib.ReadOptions(num_threads=4)),
    "Batch(4)": lambda lib: repr(lib.transforms.Batch(4)),
    "Batch(4, drop_remainder=True)": lambda lib: repr(lib.transforms.Batch(4, drop_remainder=True)),
    "ShardOptions(1, 4)": lambda lib: repr(lib.sharding.ShardOptions(1, 4)),
    "map(Map subclass)": lambda lib: str(lib.MapDataset.range(5).map(_transforms(lib)[0]())),
    "map(function)": lambda lib: str(lib.MapDataset.range(5).map(double)),
    "map(lambda)": lambda lib: str(lib.MapDataset.range(5).map(lambda x: x)),
    "map(partial)": lambda lib: str(lib.MapDataset.range(5).map(functools.partial(double))),
    "map(transform with its own repr)": lambda lib: str(lib.MapDataset.range(5).map(_transforms(lib)[5]())),
    "filter": lambda lib: str(lib.MapDataset.range(5).filter(_transforms(lib)[1]())),
    "random_map": lambda lib: str(lib.MapDataset.range(5).random_map(_transforms(lib)[2](), seed=1)),
    "map_with_index": lambda lib: str(lib.MapDataset.range(5).map_with_index(_transforms(lib)[3]())),
    "iter map": lambda lib: str(lib.MapDataset.range(5).to_iter_dataset().map(_transforms(lib)[0]())),
    "iter filter": lambda lib: str(lib.MapDataset.range(5).to_iter_dataset().filter(_transforms(lib)[1]())),
    "iter random_map": lambda lib: str(
        lib.MapDataset.range(5).to_iter_dataset().random_map(_transforms(lib)[2](), seed=1)
    ),
    "FlatMapMapDataset": lambda lib: str(
        lib.experimental.FlatMapMapDataset(lib.MapDataset.range(5), _transforms(lib)[4]())
    ),
    "FlatMapIterDataset": lambda lib: str(
        lib.experimental.FlatMapIterDataset(lib.MapDataset.range(5).to_iter_dataset(), _transforms(lib)[4]())
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_text_equals_grains(grain_ref, case):
    import grain

    del grain_ref  # absl flags parsed before grain is used
    ours, theirs = CASES[case](grainlike), CASES[case](grain)
    print(f"grain:     {theirs}\ngrainlike: {ours}")
    assert ours == theirs


def test_grainlike_only_fields_stay_out_of_the_repr_but_keep_their_values():
    options = grainlike.MultiprocessingOptions(num_workers=2, warm_start=True, stall_timeout_s=5.0)
    assert "warm_start" not in repr(options) and "stall_timeout_s" not in repr(options)
    assert (options.warm_start, options.stall_timeout_s) == (True, 5.0)
    batch = grainlike.transforms.Batch(4, pad=True)
    assert repr(batch) == "Batch(batch_size=4, drop_remainder=False, batch_fn=None)"
    assert batch != grainlike.transforms.Batch(4)  # pad still tells them apart


def test_describe_names_where_the_transform_was_defined():
    Plus = _transforms(grainlike)[0]
    ds = grainlike.MapDataset.range(5).map(Plus())
    assert str(ds) == "MapMapDataset(transform=Plus)"
    described = ds.describe()
    assert described.startswith("MapMapDataset(transform=_transforms.<locals>.Plus (")
    assert described.endswith(f"tests/compat/test_reprs_compat.py:{inspect.getsourcelines(Plus)[1]}))")
    plain = grainlike.MapDataset.range(5)
    assert plain.describe() == str(plain)


def test_a_failing_transform_is_still_named_with_its_file_and_line():
    def boom(x):
        raise ValueError(f"bad {x}")

    it = iter(grainlike.MapDataset.range(3).to_iter_dataset().map(boom))
    with pytest.raises(ValueError) as info:
        next(it)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert f"test_reprs_compat.py:{boom.__code__.co_firstlineno}" in notes
