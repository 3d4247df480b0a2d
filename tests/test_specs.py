"""element_spec / zeros_batch: the shapes and dtypes of a loader's batches."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import grainlike as grain
from grainlike.jax.batch_specs import element_spec, first_output, zeros_batch
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
    # The float64 leaf is described as it reaches the device: float32 without x64.
    assert spec == {
        "image": S((4, 2, 3), np.uint8), "label": S((4,), np.int32),
        "pair": (S((4,), np.float32), S((4, 4), np.float32)),
    }


def test_element_spec_matches_the_batches_a_padded_loader_puts_on_the_device():
    loader = make_loader(0, pad=True)
    spec = element_spec(loader)
    assert spec["mask"] == jax.ShapeDtypeStruct((4,), np.bool_)
    it = iter(loader)
    for _ in range(4):  # past the end of an epoch: same shapes
        batch = jax.device_put(next(it))
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


class CountingSource:
    """10 records; remembers every key read."""

    def __init__(self, n=10):
        self.n = n
        self.reads = []

    def __len__(self):
        return self.n

    def __getitem__(self, k):
        self.reads.append(k)
        return {"x": np.int32(k), "v": np.zeros(3, np.float32)}


def counting_loader(operations, worker_count=0, n=10):
    source = CountingSource(n)
    loader = grain.DataLoader(
        data_source=source,
        sampler=grain.IndexSampler(n, grain.NoSharding(), shuffle=True, num_epochs=1, seed=0),
        operations=operations,
        worker_count=worker_count,
    )
    return loader, source


def test_spec_is_the_configured_batch_not_the_first_output():
    # 2 workers over 10 records: worker 0's first batch holds 5 records.
    loader, source = counting_loader([grain.Batch(8)], worker_count=2)
    assert first_output(loader)["x"].shape == (5,)
    source.reads.clear()
    spec = element_spec(loader)
    assert spec["x"] == jax.ShapeDtypeStruct((8,), np.int32)
    assert spec["v"] == jax.ShapeDtypeStruct((8, 3), np.float32)
    assert len(source.reads) == 1  # one element read, nothing beyond


def test_drop_remainder_over_too_few_records_still_has_a_spec():
    loader, _ = counting_loader([grain.Batch(16, drop_remainder=True)])
    assert list(loader) == []
    assert element_spec(loader)["x"].shape == (16,)


@pytest.mark.parametrize("pad", [False, True])
def test_an_explicit_batch_size_sets_the_leading_axis(pad):
    loader, source = counting_loader([grain.Batch(4, pad=pad)])
    zeros = zeros_batch(loader, batch_size=1000)
    assert zeros["x"].shape == (1000,) and zeros["v"].shape == (1000, 3)
    assert ("mask" in zeros) == pad
    if pad:
        assert zeros["mask"].shape == (1000,) and not zeros["mask"].any()
    assert len(source.reads) == 1


def test_a_loader_without_batch_describes_one_observation():
    loader, _ = counting_loader([])
    spec = element_spec(loader)
    assert spec == {"x": jax.ShapeDtypeStruct((), np.int32), "v": jax.ShapeDtypeStruct((3,), np.float32)}
    assert zeros_batch(loader, 3)["v"].shape == (3, 3)


def test_the_spec_matches_what_the_loader_yields_with_a_batch_fn():
    def pairs(values):
        return {"x": np.stack([v["x"] for v in values]).reshape(-1, 2)}

    loader, _ = counting_loader([grain.Batch(4, batch_fn=pairs)])
    batch = next(iter(loader))
    spec = element_spec(loader)
    assert spec["x"] == jax.ShapeDtypeStruct(batch["x"].shape, batch["x"].dtype) == \
        jax.ShapeDtypeStruct((2, 2), np.int32)


def test_bad_batch_size_is_rejected():
    loader, _ = counting_loader([grain.Batch(4)])
    with pytest.raises(ValueError, match="batch_size must be a positive int or None, got 0"):
        zeros_batch(loader, 0)


def test_maps_after_the_batch_are_applied_to_the_described_batch():
    class Flatten(grain.MapTransform):
        def map(self, batch):
            return {"flat": batch["v"].reshape(-1), "x": batch["x"]}

    loader, _ = counting_loader([grain.Batch(4), Flatten()])
    spec = element_spec(loader)
    assert spec == {"flat": jax.ShapeDtypeStruct((12,), np.float32), "x": jax.ShapeDtypeStruct((4,), np.int32)}
    assert jax.tree.map(lambda x: x.shape, next(iter(loader))) == {"flat": (12,), "x": (4,)}


def arrays_loader(dtype):
    values = np.arange(6).astype(dtype)
    return grain.DataLoader(
        data_source=grain.ArraysSource({"v": values, "pair": np.stack([values, values], 1)}),
        sampler=grain.IndexSampler(6, grain.NoSharding(), num_epochs=None),
        operations=[grain.Batch(2)],
    )


def dtypes_inside_jit(loader):
    """The dtypes of the batch reference_data(loader) delivers to a jitted function."""
    with grain.reference_data(loader, cache_size=1) as data:
        _, batch, _ = jax.jit(data.next)(data.init())
        return jax.tree.map(lambda x: x.dtype, batch)


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.float32, np.uint8, np.bool_])
def test_zeros_batch_has_the_dtypes_of_the_batches_inside_jit(dtype):
    loader = arrays_loader(dtype)
    want = dtypes_inside_jit(loader)
    assert jax.tree.map(lambda x: x.dtype, zeros_batch(loader)) == want
    assert jax.tree.map(lambda s: s.dtype, element_spec(loader)) == want
    if dtype in (np.float64, np.int64):  # x64 is off in the tests: the 32-bit kind
        assert want["v"] == {np.float64: np.float32, np.int64: np.int32}[dtype]


def run_python(code, env=None):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # imports tests.*
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=60, cwd=root, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_with_x64_the_64_bit_dtypes_stay_as_inside_jit():
    # Enabling x64 in this process would change every later test's dtypes.
    out = run_python("""
        import jax, numpy as np
        from tests.test_specs import arrays_loader, dtypes_inside_jit
        from grainlike.jax.batch_specs import zeros_batch
        for dtype in (np.float64, np.int64):
            loader = arrays_loader(dtype)
            got = {k: str(v.dtype) for k, v in zeros_batch(loader).items()}
            want = {k: str(v) for k, v in dtypes_inside_jit(loader).items()}
            print(dtype.__name__, got == want, got["v"])
    """, env={"JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu"})
    assert out.split() == ["float64", "True", "float64", "int64", "True", "int64"]


def test_without_jax_zeros_batch_keeps_the_host_dtypes():
    out = run_python("""
        import sys
        sys.modules["jax"] = None  # as if jax were not installed
        import numpy as np
        import grainlike as grain
        from grainlike.jax.batch_specs import zeros_batch
        loader = grain.DataLoader(
            data_source=grain.ArraysSource({"v": np.arange(4.0), "i": np.arange(4)}),
            sampler=grain.IndexSampler(4, grain.NoSharding(), num_epochs=1),
            operations=[grain.Batch(2)],
        )
        print(zeros_batch(loader)["v"].dtype, zeros_batch(loader)["i"].dtype)
    """)
    assert out.split() == ["float64", "int64"]
