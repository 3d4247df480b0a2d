"""``grain.experimental.device_put`` against grain 0.2.18 on JAX's CPU device.

The same values (as jax arrays, on the device asked for), the same state before
every step, restores across the two libraries and at every step.
"""

import numpy as np
import pytest

from grainlike.dataset.conformance import assert_equal_output_after_checkpoint
from tests.compat.dataset_pairs import GRAINLIKE, grain_namespace, rest, run
from tests.compat.experimental_pairs import experimental

jax = pytest.importorskip("jax")


def _pipeline(lib, **kwargs):
    ds = lib.MapDataset.range(11).map(lambda x: {"x": np.full(3, x, np.float32), "y": np.int32(x)})
    ds = ds.to_iter_dataset().batch(4)
    return experimental(lib).device_put(ds, jax.devices("cpu")[0], **kwargs)


def _host(values):
    return [jax.tree.map(np.asarray, v) for v in values]


@pytest.mark.parametrize("buffers", [{}, {"cpu_buffer_size": 0, "device_buffer_size": 1}])
def test_device_put_matches_reference(grain_ref, buffers):
    g_ds, l_ds = _pipeline(grain_namespace(grain_ref), **buffers), _pipeline(GRAINLIKE, **buffers)
    g_values, g_states = run(g_ds)
    l_values, l_states = run(l_ds)
    for v in l_values:
        assert isinstance(v["x"], jax.Array) and v["x"].devices() == {jax.devices("cpu")[0]}
    np.testing.assert_equal(_host(l_values), _host(g_values))
    assert l_states == g_states
    for k in (0, 1, len(g_values)):
        it = iter(l_ds)
        it.set_state(g_states[k])
        np.testing.assert_equal(_host(rest(it)), _host(g_values[k:]))
        it = iter(g_ds)
        it.set_state(l_states[k])
        np.testing.assert_equal(_host(rest(it)), _host(l_values[k:]))


def test_device_put_restores_at_every_step():
    assert_equal_output_after_checkpoint(_pipeline(GRAINLIKE))


def test_leaves_viewing_a_buffer_are_copied_before_jax_sees_them(monkeypatch):
    # On CPU jax.device_put may alias a numpy buffer; one that is refilled for
    # every element must not reach it.
    buffer = np.zeros((2, 4), np.float32)
    handed = []
    real_put = jax.device_put

    def put(x, device=None, **kwargs):
        handed.extend(np.shares_memory(leaf, buffer) for leaf in jax.tree.leaves(x))
        return real_put(x, device, **kwargs)

    monkeypatch.setattr(jax, "device_put", put)

    def refill(i):
        buffer[:] = i
        return buffer[:]

    ds = GRAINLIKE.MapDataset.range(3).to_iter_dataset().map(refill)
    got = list(experimental(GRAINLIKE).device_put(ds, jax.devices("cpu")[0], cpu_buffer_size=0, device_buffer_size=0))
    assert [float(np.asarray(g)[0, 0]) for g in got] == [0.0, 1.0, 2.0]
    assert handed == [False, False, False]


def test_negative_buffer_sizes_raise_value_error_as_reference(grain_ref):
    for lib in (grain_namespace(grain_ref), GRAINLIKE):
        ds = lib.MapDataset.range(2).to_iter_dataset()
        with pytest.raises(ValueError):
            experimental(lib).device_put(ds, jax.devices("cpu")[0], cpu_buffer_size=-1)
