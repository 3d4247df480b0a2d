"""element_spec / zeros_batch: the shapes and dtypes of a loader's batches."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import grainlike as grain
from grainlike.specs import element_spec, first_output, zeros_batch
from tests.helpers.leaks import worker_children

pytestmark = pytest.mark.timeout(60)


def make_loader(worker_count=0, pad=False, num_records=10, name=False, keep=lambda x: True):
    class Features(grain.MapTransform):
        def map(self, x):
            out = {"image": np.full((2, 3), x, np.uint8), "label": np.int32(x % 3),
                   "pair": (np.float32(x), np.zeros(4, np.float64))}
            if name:
                out["name"] = f"r{x}"
            return out

    class Keep(grain.FilterTransform):
        def filter(self, x):
            return keep(x)

    return grain.DataLoader(
        data_source=list(range(num_records)),
        sampler=grain.IndexSampler(num_records, grain.NoSharding(), shuffle=True,
                                   num_epochs=None, seed=0),
        operations=[Features(), Keep(), grain.Batch(4, pad=pad)],
        worker_count=worker_count,
    )


@pytest.mark.parametrize("worker_count", [0, 2])
def test_element_spec_describes_every_leaf_without_starting_workers(worker_count):
    before = worker_children()
    spec = element_spec(make_loader(worker_count))
    assert worker_children() <= before
    S = jax.ShapeDtypeStruct
    assert spec == {
        "image": S((4, 2, 3), np.uint8), "label": S((4,), np.int32),
        "pair": (S((4,), np.float32), S((4, 4), np.float64)),
    }


def test_element_spec_matches_the_batches_a_padded_loader_yields():
    loader = make_loader(0, pad=True)
    spec = element_spec(loader)
    assert spec["mask"] == jax.ShapeDtypeStruct((4,), np.bool_)
    it = iter(loader)
    for _ in range(4):  # past the end of an epoch: same shapes
        batch = next(it)
        shapes = jax.tree.map(lambda x: (x.shape, x.dtype), batch)
        assert shapes == jax.tree.map(lambda s: (s.shape, s.dtype), spec)


def test_zeros_batch_is_all_zero_with_the_same_structure():
    loader = make_loader(0, pad=True)
    zeros = zeros_batch(loader)
    spec = element_spec(loader)
    assert jax.tree.structure(zeros) == jax.tree.structure(spec)
    for z, s in zip(jax.tree.leaves(zeros), jax.tree.leaves(spec)):
        assert z.shape == s.shape and z.dtype == s.dtype and not z.any()


def test_non_numeric_leaves_are_none_in_the_spec():
    loader = make_loader(0, name=True)
    assert element_spec(loader)["name"] is None
    assert zeros_batch(loader)["name"].tolist() == [""] * 4


def test_element_spec_usable_for_model_init():
    loader = make_loader(0)
    spec = element_spec(loader)

    def init(batch):
        return {"w": np.zeros((3,), np.float32) + batch["image"].sum()}

    params = jax.eval_shape(init, spec)
    assert params["w"].shape == (3,)
    assert jax.jit(init)(zeros_batch(loader))["w"].tolist() == [0, 0, 0]


def test_sharding_is_put_in_each_spec():
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    spec = element_spec(make_loader(0), sharding=sharding)
    assert all(s.sharding == sharding for s in jax.tree.leaves(spec))


def test_first_output_raises_when_everything_is_filtered():
    loader = make_loader(0, keep=lambda x: False)
    loader = grain.DataLoader(
        data_source=loader.data_source,
        sampler=grain.IndexSampler(10, grain.NoSharding(), num_epochs=1),
        operations=loader.operations,
    )
    with pytest.raises(ValueError, match="no output"):
        first_output(loader)
