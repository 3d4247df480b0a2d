"""``get_element_spec`` against grain 0.2.18: the same specs for the same pipelines.

Specs are compared as trees of ``(shape, dtype)``; nothing is iterated (the
transforms raise if called).
"""

import functools

import numpy as np
import pytest

from grainlike.core import tree
from tests.compat.dataset_pairs import GRAINLIKE, grain_namespace
from tests.compat.experimental_pairs import experimental


@pytest.fixture
def grain_lib(grain_ref):
    return grain_namespace(grain_ref)


def _transforms(lib):
    """Transforms with ``output_spec`` whose ``map`` must not run."""
    sds = experimental(lib).ShapeDtypeStruct

    class Features(lib.Map):
        def map(self, x):
            raise AssertionError("a spec is derived without computing elements")

        def output_spec(self, spec):
            return {"image": sds(shape=(8, 8, 3), dtype=np.uint8), "label": sds(shape=(), dtype=spec.dtype)}

    class Jitter(lib.RandomMap):
        def random_map(self, x, rng):
            raise AssertionError("not called")

        def output_spec(self, spec):
            return {**spec, "noise": sds(shape=(4,), dtype=np.float32)}

    return Features(), Jitter()


PIPELINES = {
    "map_batch": lambda lib, f, j: lib.MapDataset.range(10).map(f).batch(4),
    "map_batch_drop": lambda lib, f, j: lib.MapDataset.range(10).map(f).batch(4, drop_remainder=True),
    "shuffle_slice_repeat": lambda lib, f, j: lib.MapDataset.range(10).shuffle(seed=1)[1::2].repeat(2).map(f),
    "random_map_iter": lambda lib, f, j: lib.MapDataset.range(10).map(f).to_iter_dataset().random_map(j, seed=3),
    "filter_batch_iter": lambda lib, f, j: lib.MapDataset.range(10)
    .map(f)
    .to_iter_dataset()
    .filter(lambda x: True)
    .batch(2, drop_remainder=True),
    "zip": lambda lib, f, j: lib.ZipMapDataset([lib.MapDataset.range(3), lib.MapDataset.range(3).map(f)]),
    "mix": lambda lib, f, j: lib.MapDataset.mix([lib.MapDataset.range(3).map(f), lib.MapDataset.range(4).map(f)]),
    "seed_limit_prefetch": lambda lib, f, j: lib.LimitIterDataset(
        lib.ThreadPrefetchIterDataset(
            lib.MapDataset.range(5).seed(4).map(f).to_iter_dataset(), prefetch_buffer_size=2
        ),
        3,
    ),
    "mp_prefetch": lambda lib, f, j: lib.MapDataset.range(5)
    .map(f)
    .to_iter_dataset()
    .mp_prefetch(lib.MultiprocessingOptions(num_workers=2)),
    "interleave_cache_rebatch": lambda lib, f, j: experimental(lib).RebatchIterDataset(
        experimental(lib).CacheIterDataset(
            experimental(lib).InterleaveIterDataset([lib.MapDataset.range(4).map(f).batch(2)] * 2, cycle_length=2)
        ),
        3,
    ),
    "multithread": lambda lib, f, j: experimental(lib).multithread_prefetch(
        lib.MapDataset.range(4).map(f).to_iter_dataset(), num_threads=2, buffer_size=1
    ),
}


def _plain(spec):
    return tree.map_structure(
        lambda s: (tuple(s.shape), np.dtype(s.dtype).str),
        spec,
        is_leaf=lambda s: hasattr(s, "shape") and hasattr(s, "dtype"),
    )


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_element_spec_matches_reference(grain_lib, name):
    specs = []
    for lib in (grain_lib, GRAINLIKE):
        ds = PIPELINES[name](lib, *_transforms(lib))
        spec = experimental(lib).get_element_spec(ds)
        specs.append(_plain(spec))
        assert tree.flatten(specs[-1]), name
    assert specs[0] == specs[1]


@pytest.mark.parametrize("name", ["map_batch", "random_map_iter", "filter_batch_iter", "zip", "mix"])
def test_every_stage_has_grains_element_spec_property(grain_lib, name):
    # grain's tests and custom stages read ``ds._element_spec`` directly.
    specs = []
    for lib in (grain_lib, GRAINLIKE):
        ds = PIPELINES[name](lib, *_transforms(lib))
        specs.append(_plain(ds._element_spec))
        assert specs[-1] == _plain(experimental(lib).get_element_spec(ds))
    assert specs[0] == specs[1]


def test_a_stage_without_a_rule_raises_not_implemented_from_its_element_spec(grain_lib):
    for lib in (grain_lib, GRAINLIKE):

        class Plain(lib.MapDataset):
            def __len__(self):
                return 1

            def __getitem__(self, i):
                return i

        with pytest.raises(NotImplementedError, match="`element_spec` inference is not implemented for Plain"):
            Plain()._element_spec


def test_range_is_int64_scalars_and_batch_dims_follow_drop_remainder(grain_lib):
    for lib in (grain_lib, GRAINLIKE):
        spec = experimental(lib).get_element_spec(lib.MapDataset.range(3))
        assert isinstance(spec, experimental(lib).ShapeDtypeStruct)
        assert (spec.shape, np.dtype(spec.dtype)) == ((), np.int64)
        batched = experimental(lib).get_element_spec(lib.MapDataset.range(3).batch(2))
        assert batched.shape == (None,)


def test_a_dataset_of_its_own_says_its_spec(grain_lib):
    for lib in (grain_lib, GRAINLIKE):
        sds = experimental(lib).ShapeDtypeStruct

        class Tokens(lib.MapDataset):
            def __len__(self):
                return 4

            def __getitem__(self, i):
                return np.zeros(16, np.int32)

            @property
            def _element_spec(self):
                return sds(shape=(16,), dtype=np.int32)

        spec = experimental(lib).get_element_spec(Tokens().to_iter_dataset().batch(2, drop_remainder=True))
        assert _plain(spec) == ((2, 16), "<i4"), lib.name


@pytest.mark.parametrize(
    "build, error",
    [
        (lambda lib: lib.MapDataset.range(3).map(lambda x: x), ValueError),
        (lambda lib: lib.MapDataset.source([1, 2]), NotImplementedError),
        (lambda lib: lib.MapDataset.range(3).batch(2, batch_fn=list), NotImplementedError),
        (
            lambda lib: lib.MapDataset.range(4).batch(
                2, batch_fn=functools.partial(lib.batch_and_pad, batch_size=2)
            ),
            NotImplementedError,
        ),
    ],
)
def test_specs_that_cannot_be_known_raise_as_reference(grain_lib, build, error):
    for lib in (grain_lib, GRAINLIKE):
        with pytest.raises(error):
            experimental(lib).get_element_spec(build(lib))


def test_shape_dtype_struct_is_grains(grain_lib):
    from grainlike.experimental import ShapeDtypeStruct, ShapeDtypeStructProtocol

    s = ShapeDtypeStruct(shape=(None, 3), dtype=np.float32)
    assert s == ShapeDtypeStruct((None, 3), np.float32) and hash(s) == hash(ShapeDtypeStruct((None, 3), np.float32))
    with pytest.raises(AttributeError):
        s.shape = (1,)
    assert isinstance(np.zeros(2), ShapeDtypeStructProtocol)
    assert isinstance(experimental(grain_lib).ShapeDtypeStruct((1,), np.int8), ShapeDtypeStructProtocol)
    assert not isinstance(3, ShapeDtypeStructProtocol)
    assert repr(s).replace("grainlike", "") == repr(experimental(grain_lib).ShapeDtypeStruct((None, 3), np.float32))
