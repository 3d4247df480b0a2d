"""grainlike.compat.jax_sgmc against the real JaxSGMC 0.1.5 (PyPI ``jax-sgmc``, a test-only dependency).

The same code runs once with ``jax_sgmc`` and once with ``grainlike.compat.jax_sgmc``
and must give the same batches, random draws, masks, mapped results and saved
samples. JaxSGMC 0.1.5's ``io`` (and ``scheduler``) import
``jax.experimental.host_callback``, which JAX has since removed; the reference is
run with that module's ``id_tap`` (``tap_func(arg, transforms)`` called on the
host, in program order, returning ``result``) provided by an ordered
``io_callback``, as JAX implemented it in its last releases that had it.

The last tests run every example of JaxSGMC's data and io documentation (the
pages as of 0.1.5, transcribed below) with only ``jax_sgmc`` changed to
``grainlike.compat.jax_sgmc`` in the imports, and compare what they print with
what the documentation shows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import io as stdio
import json
import math
import os
import re
import subprocess
import sys
import types
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = [
    pytest.mark.timeout(300),
    # JaxSGMC warns when a cache holds more observations than the dataset; so does the face.
    pytest.mark.filterwarnings("ignore:Cached batches are bigger than the total dataset"),
    pytest.mark.filterwarnings("ignore:Explicitly requested dtype"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _install_host_callback():
    """``jax.experimental.host_callback.id_tap``, where this JAX no longer has the module."""
    if "jax.experimental.host_callback" in sys.modules:
        return
    if importlib.util.find_spec("jax.experimental.host_callback") is not None:
        return
    module = types.ModuleType("jax.experimental.host_callback")

    def id_tap(tap_func, arg, *, result=None, **unused):
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(arg)):
            jax.experimental.io_callback(lambda a: tap_func(a, ()), None, arg, ordered=True)
        else:  # called eagerly: the tap runs now
            tap_func(jax.tree.map(np.asarray, arg), ())
        return arg if result is None else result

    module.id_tap = id_tap
    sys.modules[module.__name__] = module


def _modules(package: str) -> types.SimpleNamespace:
    names = ("data", "data.numpy_loader", "data.hdf5_loader", "io", "scheduler")
    loaded = {name.split(".")[-1]: importlib.import_module(f"{package}.{name}") for name in names}
    return types.SimpleNamespace(**loaded)


@pytest.fixture(scope="module")
def ref():
    """JaxSGMC 0.1.5's modules."""
    pytest.importorskip("jax_sgmc", reason="jax-sgmc 0.1.5 is a test-only dependency (the dev extra)")
    _install_host_callback()
    return _modules("jax_sgmc")


@pytest.fixture(scope="module")
def gl():
    """grainlike.compat.jax_sgmc's modules."""
    return _modules("grainlike.compat.jax_sgmc")


@pytest.fixture
def old_jax_names(monkeypatch):
    # JaxSGMC's HDF5Loader calls jax.tree_structure / jax.tree_map, since removed from JAX.
    monkeypatch.setattr(jax, "tree_structure", jax.tree_util.tree_structure, raising=False)
    monkeypatch.setattr(jax, "tree_map", jax.tree_util.tree_map, raising=False)
    monkeypatch.setattr(jax, "tree_unflatten", jax.tree_util.tree_unflatten, raising=False)


def plain(x):
    """``x`` as plain, comparable values: arrays with their kind, dtype, weak type and values."""
    if isinstance(x, jax.Array):
        return ("Array", str(x.dtype), x.shape, bool(getattr(x, "weak_type", False)), np.asarray(x).tolist())
    if isinstance(x, np.ndarray):
        return ("ndarray", str(x.dtype), x.shape, x.tolist())
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return (type(x).__name__, {f: plain(v) for f, v in zip(x._fields, x)})
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__, {f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x)})
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(plain(v) for v in x)
    if isinstance(x, np.generic):
        return (type(x).__name__, x.item())
    return (type(x).__name__, x)


def arrays(n: int) -> dict:
    return {"x": np.arange(n), "y": (np.arange(2 * n, dtype=np.float64) / 7).reshape(n, 2)}


# -- data: loaders, random draws, full data ------------------------------------------------------


@pytest.mark.parametrize("kind", ["NumpyDataLoader", "DeviceNumpyDataLoader"])
def test_initializer_batch_and_static_information_equal_jaxsgmcs(ref, gl, kind):
    def run(m):
        loader = getattr(m.numpy_loader, kind)(**arrays(6), z=np.zeros((6, 4, 3), np.float32))
        return [plain(loader.initializer_batch()), plain(loader.initializer_batch(3)), loader.static_information,
                plain(loader._format)]

    assert run(gl) == run(ref)


CHAIN_KWARGS = [{}, {"shuffle": True}, {"shuffle": True, "in_epochs": True},
                {"seed": 11}, {"seed": 5, "shuffle": True}, {"seed": 3, "shuffle": True, "in_epochs": True}]


@pytest.mark.parametrize("n, mb_size, cache", [(10, 3, 2), (7, 7, 1), (23, 4, 5), (12, 4, 3), (5, 2, 8)])
def test_random_reference_data_draws_jaxsgmcs_batches_in_every_mode(ref, gl, n, mb_size, cache):
    steps = 3 * math.ceil(n / mb_size) + cache + 1

    def run(m):
        loader = m.numpy_loader.NumpyDataLoader(**arrays(n))
        init_fn, batch_fn, release = m.data.random_reference_data(loader, cache, mb_size)
        chains = [init_fn(**kwargs) for kwargs in CHAIN_KWARGS]  # chain ids 0..5: the default seeds

        def body(state, _):
            state, (batch, info) = batch_fn(state, information=True)
            return state, (batch, info.mask)

        scanned = jax.jit(lambda s: jax.lax.scan(body, s, None, length=steps)[1])
        out = [plain(scanned(chain)) for chain in chains]
        # Eagerly, with the information JaxSGMC returns (Python ints, the mask), on a new
        # chain: JaxSGMC refuses a state whose cache was refilled already.
        state = init_fn(shuffle=True, in_epochs=True)
        for _ in range(cache + 2):
            state, (batch, info) = batch_fn(state, information=True)
            out.append(plain((batch, info)))
        state, batch = batch_fn(state)
        out.append(plain(batch))
        release()
        return out

    assert run(gl) == run(ref)


def test_a_chains_default_seed_counts_the_loaders_ordered_chains_too(ref, gl):
    def run(m):
        loader = m.numpy_loader.NumpyDataLoader(**arrays(9))
        full_init, _, _ = m.data.full_reference_data(loader, 2, 3)
        full_init()  # chain 0
        init_fn, batch_fn, _ = m.data.random_reference_data(loader, 2, 3)
        state = init_fn(shuffle=True)  # chain 1: seed 1
        batches = []
        for _ in range(5):
            state, batch = batch_fn(state)
            batches.append(plain(batch))
        return batches

    assert run(gl) == run(ref)


@pytest.mark.parametrize("kwargs", CHAIN_KWARGS[:3] + [{"ordered": True}])
def test_loader_get_batches_save_state_and_load_state_equal_jaxsgmcs(ref, gl, kwargs):
    def run(m):
        loader = m.numpy_loader.NumpyDataLoader(**arrays(11))
        if kwargs.get("ordered"):
            chain = loader.register_ordered_pipeline(3, mb_size=4)
        else:
            chain = loader.register_random_pipeline(3, mb_size=4, **kwargs)
        out = [plain(loader.get_batches(chain)) for _ in range(3)]
        saved = loader.save_state(chain)
        kind, value = next(iter(saved.items()))
        if kind == "random":
            rng_state, chain_data = value
            value = (rng_state, {k: plain(v) for k, v in chain_data.items()})
        after = [plain(loader.get_batches(chain)) for _ in range(3)]
        loader.load_state(chain, dict(saved))  # JaxSGMC's load_state empties the dict it is given
        again = [plain(loader.get_batches(chain)) for _ in range(3)]
        assert again == after
        return out, after, (kind, value)

    assert run(gl) == run(ref)


def test_a_pickled_loader_continues_its_chains_and_bad_modes_are_refused_alike(ref, gl):
    import pickle

    def run(m):
        loader = m.numpy_loader.NumpyDataLoader(**arrays(10))
        chain = loader.register_random_pipeline(2, mb_size=3, shuffle=True)
        loader.get_batches(chain)
        copy = pickle.loads(pickle.dumps(loader))
        out = [plain(loader.get_batches(chain)), plain(copy.get_batches(chain))]
        init_fn, _, release = m.data.random_reference_data(loader, 2, 3)
        with pytest.raises(ValueError) as refused:
            init_fn(in_epochs=True)
        out.append(str(refused.value))
        with pytest.raises(ValueError) as refused:
            m.data.random_reference_data(loader, 2, 11)
        out.append(str(refused.value))
        release()
        return out

    gl_out = run(gl)
    assert gl_out == run(ref)
    assert gl_out[0] == gl_out[1]


@pytest.mark.parametrize("n, mb_size, cache", [(10, 4, 2), (13, 5, 4)])
def test_full_reference_data_maps_as_jaxsgmc_does(ref, gl, n, mb_size, cache):
    def run(m):
        loader = m.numpy_loader.NumpyDataLoader(**arrays(n))
        init_fn, map_fn, release = m.data.full_reference_data(loader, cached_batches_count=cache, mb_size=mb_size)
        state = init_fn()
        out = []
        for _ in range(3):  # passes that start anywhere in a cache
            # Unmasked: one result per observation; the carry sees the fillers too.
            state, (results, carry) = map_fn(lambda b, c: (b["x"] * 10 + b["y"][:, 0], c + jnp.sum(b["x"])),
                                             state, 0)
            out.append(plain((results, carry)))
        state, (results, carry) = map_fn(lambda b, mask, c: (jnp.sum(mask * b["x"]), c + 1), state, 0, masking=True)
        out.append(plain((results, carry)))
        state, ((xs, masks), carry) = map_fn(lambda b, c: ((b[0]["x"], b[1].mask), c), state, None,
                                             information=True)
        out.append(plain((xs, masks, carry)))

        def body(state, exponent):
            state, (sums, _) = map_fn(lambda b, mask, c: (jnp.sum(mask * b["x"] ** exponent), c), state, None,
                                      masking=True)
            return state, jnp.sum(sums)

        out.append(plain(jax.jit(lambda s: jax.lax.scan(body, s, jnp.arange(3))[1])(state)))
        release()
        return out

    assert run(gl) == run(ref)


def test_full_data_mapper_maps_as_jaxsgmc_does(ref, gl):
    def run(m):
        loader = m.numpy_loader.NumpyDataLoader(**arrays(10))
        mapper_fn, release = m.data.full_data_mapper(loader, cached_batches_count=2, mb_size=4)
        out = [plain(mapper_fn(lambda b, c: (b["x"] + 1, c), 5)) for _ in range(3)]
        masked = jax.jit(lambda c: mapper_fn(lambda b, mask, c: (jnp.sum(mask * b["x"]), c + jnp.sum(b["x"])), c,
                                             masking=True))
        out += [plain(masked(0)) for _ in range(3)]
        single, release_single = m.data.full_data_mapper(loader, cached_batches_count=2, mb_size=3)
        out.append(plain(single(lambda obs, c: (obs["x"] * 2, c), None, batched=False)))
        release()
        release_single()
        return out

    assert run(gl) == run(ref)


def test_device_numpy_loader_draws_jaxsgmcs_batches(ref, gl):
    def run(m):
        loader = m.numpy_loader.DeviceNumpyDataLoader(**arrays(10))
        init_fn, batch_fn, _ = m.data.random_reference_data(loader, 1, 3)
        state = init_fn(key=jax.random.PRNGKey(4))
        out = []
        for _ in range(4):
            state, (batch, info) = jax.jit(lambda s: batch_fn(s, information=True))(state)
            out.append(plain((batch, info.mask)))
        init_fn, map_fn, _ = m.data.full_reference_data(loader, 3, 3)  # JaxSGMC batches by the cache count
        _, (results, carry) = map_fn(lambda b, c: (b["x"] * 2, c), init_fn(), None)
        out.append(plain(results))
        return out

    assert run(gl) == run(ref)


def test_hdf5_loader_draws_jaxsgmcs_batches_from_saved_samples(ref, gl, old_jax_names, tmp_path):
    h5py = pytest.importorskip("h5py", reason="h5py is in the hdf5 extra")
    with h5py.File(tmp_path / "samples.h5", "w") as f:
        f["/chain~0/variables/w"] = np.arange(24.0).reshape(12, 2)
        f["/chain~0/variables/b"] = np.arange(12)

    def run(m):
        sample = {"w": np.zeros(2), "b": np.int64(0)}
        loader = m.hdf5_loader.HDF5Loader(str(tmp_path / "samples.h5"), subdir="/chain~0/variables/", sample=sample)
        init_fn, batch_fn, release = m.data.random_reference_data(loader, 2, 5)
        out = []
        for kwargs in ({}, {"shuffle": True}):
            state = init_fn(**kwargs)
            for _ in range(4):
                state, batch = batch_fn(state)
                out.append(plain(batch))
        release()
        loader.close()
        return out

    assert run(gl) == run(ref)


def test_tensorflow_loader_gives_jaxsgmcs_shapes_and_dtypes(ref, gl):
    tf = pytest.importorskip("tensorflow", reason="tensorflow is in the dev extra")
    pytest.importorskip("tensorflow_datasets", reason="JaxSGMC's loader imports tensorflow_datasets")
    ref_tf = importlib.import_module("jax_sgmc.data.tensorflow_loader")
    gl_tf = importlib.import_module("grainlike.compat.jax_sgmc.data.tensorflow_loader")
    pipeline = tf.data.Dataset.from_tensor_slices({
        "image": np.zeros((40, 4, 4, 3), np.uint8), "label": np.arange(40), "id": [b"a"] * 40})

    def run(m, module):
        loader = module.TensorflowDataLoader(pipeline, shuffle_cache=10, exclude_keys=["id"])
        init_fn, batch_fn, release = m.data.random_reference_data(loader, 3, 8)
        state, batch = batch_fn(init_fn())
        shapes = jax.tree.map(lambda x: (x.shape, str(x.dtype)), (loader.initializer_batch(5), batch))
        labels = np.asarray(batch["label"]).tolist()
        for _ in range(4):
            state, batch = batch_fn(state)
            labels += np.asarray(batch["label"]).tolist()
        return shapes, sorted(labels)

    gl_shapes, gl_labels = run(gl, gl_tf)
    ref_shapes, _ = run(ref, ref_tf)
    assert gl_shapes == ref_shapes
    # The face shuffles exactly: the first 5 batches make up one epoch
    # (JaxSGMC's unseeded shuffle buffer of 10 lets epochs run into each other).
    assert gl_labels == list(range(40))


# -- io: saving inside jit ---------------------------------------------------------------------------


class Params(NamedTuple):
    a: jax.Array
    b: jax.Array


class Unsorted(NamedTuple):
    z: jax.Array
    a: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Layer:
    w: jax.Array
    b: jax.Array


def _trees() -> dict:
    f, v, i = jnp.float32(0), jnp.zeros(2, jnp.float32), jnp.int32(0)
    return {
        "dict": {"iteration": i, "x": v},
        "namedtuple": Params(f, v),
        "dataclass": Layer(v, f),
        "nested": {"p": [Params(f, (v, {"c": i})), Layer(f, v)], "q": (f, [v, i])},
        "unsorted_namedtuple": Unsorted(f, v),
        "long_list": [f] * 12,
    }


TREES = _trees()
# Trees whose leaves JaxSGMC 0.1.5 also names right: it pairs the dict form's
# sorted keys with the tree's leaves, so namedtuples with unsorted fields and
# lists of more than ten elements get their names shuffled there.
NAMED_RIGHT_BY_JAXSGMC = ["dict", "namedtuple", "dataclass", "nested"]


def _sample(tree, i):
    leaves, treedef = jax.tree.flatten(tree)
    return jax.tree.unflatten(treedef, [jnp.full(jnp.shape(x), 100 * k + i, jnp.result_type(x))
                                        for k, x in enumerate(leaves)])


def _save_run(m, tree, collector, init_checkpoint=None, steps=5):
    init_save, save, postprocess_save = m.io.save(collector)
    state = init_save(tree, init_checkpoint, m.scheduler.static_information(samples_collected=3))

    def update(state, it):
        return save(state, jnp.mod(it, 2) == 0, _sample(tree, it))

    final, _ = jax.lax.scan(update, state, jnp.arange(steps))
    return postprocess_save(final, None)


@pytest.mark.parametrize("name", sorted(TREES))
def test_memory_collector_returns_jaxsgmcs_samples(ref, gl, name):
    tree = TREES[name]
    assert plain(_save_run(gl, tree, gl.io.MemoryCollector())) == plain(_save_run(ref, tree, ref.io.MemoryCollector()))


@pytest.mark.parametrize("name", NAMED_RIGHT_BY_JAXSGMC)
def test_memory_collector_writes_jaxsgmcs_npz_files(ref, gl, name, tmp_path):
    def run(m):
        directory = tmp_path / m.io.__name__
        _save_run(m, TREES[name], m.io.MemoryCollector(save_dir=str(directory)))
        with np.load(directory / "chain_0.npz") as f:
            return {k: plain(f[k]) for k in f.files}

    assert run(gl) == run(ref)


@pytest.mark.parametrize("name", NAMED_RIGHT_BY_JAXSGMC)
def test_hdf5_collector_writes_jaxsgmcs_datasets(ref, gl, name, tmp_path):
    h5py = pytest.importorskip("h5py", reason="h5py is in the hdf5 extra")

    def run(m):
        with h5py.File(tmp_path / f"{m.io.__name__}.h5", "w") as f:
            out = _save_run(m, TREES[name], m.io.HDF5Collector(f), init_checkpoint={})
            datasets = {}
            f.visititems(lambda key, node: datasets.update({key: plain(node[:])})
                         if isinstance(node, h5py.Dataset) else None)
        return plain(out), datasets

    assert run(gl) == run(ref)


def test_no_save_keeps_jaxsgmcs_samples_on_the_device(ref, gl):
    def run(m):
        out = []
        for tree in (TREES["dict"], TREES["nested"]):
            init_save, save, postprocess_save = m.io.no_save()
            state = init_save(tree, None, m.scheduler.static_information(samples_collected=3))
            final, _ = jax.lax.scan(lambda s, it: save(s, jnp.mod(it, 2) == 0, _sample(tree, it)), state,
                                    jnp.arange(5))
            out.append(plain(postprocess_save(final, None)))
        return out

    assert run(gl) == run(ref)


def test_several_chains_of_one_collector_keep_their_own_samples(ref, gl):
    def run(m):
        collector = m.io.MemoryCollector()
        init_save, save, postprocess_save = m.io.save(collector)
        info = m.scheduler.static_information(samples_collected=4)
        states = [init_save({"x": jnp.float32(0)}, None, info) for _ in range(2)]
        finals = [jax.lax.scan(lambda s, it: save(s, True, {"x": it * 1.0 + 10 * c}), s, jnp.arange(4))[0]
                  for c, s in enumerate(states)]
        return [plain(postprocess_save(f, None)) for f in finals]

    assert run(gl) == run(ref)


@pytest.mark.parametrize("name", NAMED_RIGHT_BY_JAXSGMC)
def test_pytree_dicts_equal_jaxsgmcs(ref, gl, name):
    tree = _sample(TREES[name], 1)

    def run(m):
        as_dict = m.io.pytree_to_dict(tree)
        return (plain(as_dict), m.io.pytree_dict_keys(tree), m.io.pytree_dict_keys(as_dict),
                plain(m.io.dict_to_pytree(as_dict, tree)))

    assert run(gl) == run(ref)


@pytest.mark.parametrize("name", ["unsorted_namedtuple", "long_list"])
def test_dict_to_pytree_puts_every_leaf_back_where_jaxsgmc_moves_them(ref, gl, name):
    tree = _sample(TREES[name], 1)
    back = gl.io.dict_to_pytree(gl.io.pytree_to_dict(tree), tree)
    assert plain(back) == plain(tree)
    # JaxSGMC 0.1.5 puts leaves back in the order of the dict form's sorted keys.
    assert plain(ref.io.dict_to_pytree(ref.io.pytree_to_dict(tree), tree)) != plain(tree)
    assert plain(gl.io.pytree_to_dict(tree)) == plain(ref.io.pytree_to_dict(tree))


def test_a_dictionize_rule_names_leaves_as_in_jaxsgmc(ref, gl, tmp_path):
    # Each module's rule registry is its own: one class per module.
    def run(m):
        @jax.tree_util.register_dataclass
        @dataclasses.dataclass
        class Dense:
            kernel: jax.Array
            offset: jax.Array

        @m.io.register_dictionize_rule(Dense)
        def _dense(node):
            return [("kernel", node.kernel), ("offset", node.offset)]

        tree = {"dense": Dense(jnp.zeros(2), jnp.float32(0)), "n": jnp.int32(0)}
        out = _save_run(m, tree, m.io.MemoryCollector(save_dir=str(tmp_path / m.io.__name__)))
        with np.load(tmp_path / m.io.__name__ / "chain_0.npz") as f:
            files = {k: plain(f[k]) for k in f.files}
        return plain(m.io.pytree_to_dict(tree)), m.io.pytree_dict_keys(tree), plain(out), files

    assert run(gl) == run(ref)


def test_saving_functions_refuse_what_jaxsgmc_refuses(ref, gl):
    for m in (gl, ref):
        with pytest.raises(NotImplementedError):
            m.io.save(m.io.MemoryCollector(), checkpoint_every=2)
        with pytest.raises(NotImplementedError):
            m.io.load(None, None)
        with pytest.raises(AssertionError, match="Need a sample-pytree"):
            m.io.MemoryCollector().register_chain(static_information=m.scheduler.static_information(3))


def test_json_collector_writes_a_list_per_leaf(gl, tmp_path):
    # JaxSGMC writes these files with ujson (not installed here): compact JSON lists.
    collector = gl.io.JSONCollector(str(tmp_path / "json"), write_frequency=2)
    _save_run(gl, {"a": jnp.float32(0), "b": jnp.zeros(2, jnp.int32)}, collector)
    assert sorted(os.listdir(tmp_path / "json")) == ["chain_0_iteration_2.json", "chain_0_iteration_3.json"]
    with open(tmp_path / "json" / "chain_0_iteration_3.json") as f:
        text = f.read()
    assert json.loads(text) == [[0.0, 2.0, 4.0], [[100, 100], [102, 102], [104, 104]]]
    assert " " not in text


def test_a_custom_data_collector_gets_jaxsgmcs_calls(ref, gl):
    def run(m):
        calls = []

        class Recording(m.io.DataCollector):
            def register_data_loader(self, data_loader):
                calls.append("register_data_loader")

            def register_chain(self, init_sample=None, init_checkpoint=None, static_information=None):
                calls.append(("register_chain", plain(init_sample), plain(init_checkpoint), static_information))
                return 0

            def save(self, chain_id, values):
                calls.append(("save", int(chain_id), [np.asarray(v).tolist() for v in values]))

            def finalize(self, chain_id):
                calls.append(("finalize", int(chain_id)))

            def finished(self, chain_id):
                calls.append(("finished", int(chain_id)))
                return "done"

            def checkpoint(self, chain_id, state):
                calls.append("checkpoint")

            def resume(self):
                calls.append("resume")

        out = _save_run(m, {"a": jnp.float32(0), "b": [jnp.int32(0)]}, Recording(), init_checkpoint={"c": 1})
        return calls, plain(out)

    assert run(gl) == run(ref)


# -- the documentation's examples --------------------------------------------------------------------

# JaxSGMC 0.1.5's data and io pages, example by example: (code, what the page shows
# it prints). The pages lost the module path of two imports ("from import
# NumpyDataLoader"); it is jax_sgmc.data.numpy_loader (jax_sgmc.data.tensorflow_loader).
DATA_SETUP = """\
import numpy as onp
from jax_sgmc import data
from jax_sgmc.data.numpy_loader import NumpyDataLoader
"""

EXAMPLES = {
    # The page shows these zero batches of the loader set up in the next example
    # (its code was not rendered): the first with 3 observations, the second one.
    "data_initializer_batch": (DATA_SETUP + """\
x = onp.arange(10)
y = onp.zeros((10, 2))
data_loader = NumpyDataLoader(x_r=x, y_r=y)
print(data_loader.initializer_batch(3))
print(data_loader.initializer_batch())
""", """\
{'x_r': Array([0, 0, 0], dtype=int32), 'y_r': Array([[0., 0.],
             [0., 0.],
             [0., 0.]], dtype=float32)}
{'x_r': Array(0, dtype=int32), 'y_r': Array([0., 0.], dtype=float32)}
"""),
    "data_numpy_data_loader": (DATA_SETUP + """\
# The arrays must have the same length along the first dimension,
# corresponding to the total observation count
x = onp.arange(10)
y = onp.zeros((10, 2))
data_loader = NumpyDataLoader(x_r=x, y_r=y)
rd_init, rd_batch, _ = data.random_reference_data(data_loader, 100, 2)
rd_state = rd_init(seed=0)
new_state, (rd_batch, info) = rd_batch(rd_state, information=True)
print(rd_batch)
# If necessary, information about the total sample count can be passed
print(info)
""", """\
{'x_r': Array([8, 9], dtype=int32), 'y_r': Array([[0., 0.],
       [0., 0.]], dtype=float32)}
MiniBatchInformation(observation_count=10, mask=Array([ True,  True], dtype=bool), batch_size=2)
"""),
    "data_random_access": (DATA_SETUP + """\
x = onp.arange(10)
data_loader = NumpyDataLoader(x=x)
init_fn, batch_fn, _ = data.random_reference_data(data_loader, 2, 3)
random_chain = init_fn()
shuffle_chain = init_fn(shuffle=True)
epoch_chain = init_fn(shuffle=True, in_epochs=True)
def eval_fn(chain):
  for _ in range(4):
    chain, batch = batch_fn(chain, information=True)
  print(batch)
eval_fn(random_chain)
eval_fn(shuffle_chain)
eval_fn(epoch_chain)
""", """\
({'x': Array([4, 6, 6], dtype=int32)}, MiniBatchInformation(observation_count=10, mask=Array([ True,  True,  True], dtype=bool), batch_size=3))
({'x': Array([0, 4, 7], dtype=int32)}, MiniBatchInformation(observation_count=10, mask=Array([ True,  True,  True], dtype=bool), batch_size=3))
({'x': Array([5, 0, 0], dtype=int32)}, MiniBatchInformation(observation_count=10, mask=Array([ True, False, False], dtype=bool), batch_size=3))
"""),
    "data_full_dataset": ("""\
from functools import partial
import jax.numpy as jnp
from jax.lax import scan
from jax_sgmc import data
from jax_sgmc.data.numpy_loader import NumpyDataLoader
base = jnp.arange(10)
data_loader = NumpyDataLoader(base=base)
def sum_potentials(exp, data, mask, unused_state):
  # Mask out the invalid samples (filler values, already mapped over)
  sum = jnp.sum(mask * jnp.power(data['base'], exp))
  return sum, unused_state
init_fun, map_fun, _ = data.full_reference_data(data_loader,
                                                cached_batches_count=3,
                                                mb_size=4)
# The exponential value is fixed during the mapping, therefore add it via
# functools.partial to the mapped function.
map_results = map_fun(partial(sum_potentials, 2),
                      init_fun(),
                      None,
                      masking=True)
data_state, (batch_sums, unused_state) = map_results
# As we used the masking, a single result for each batch is returned.
# Now we need to postprocess those results, in this case by summing, to
# get the true result.
summed_result = jnp.sum(batch_sums)
print(f"Result: {summed_result : d}")
# Calculate for multiple exponents:
def body_fun(data_state, exp):
  map_results = map_fun(partial(sum_potentials, exp), data_state, None, masking=True)
  # Currently, we only summed over each mini-batch but not the whole
  # dataset.
  data_state, (batch_sums, unused_state) = map_results
  return data_state, (jnp.sum(batch_sums), unused_state)
init_data_state = init_fun()
_, (result, _) = scan(body_fun, init_data_state, jnp.arange(3))
print(result)
mapper_fn, release_fn = data.full_data_mapper(data_loader,
                                              cached_batches_count=3,
                                              mb_size=4)
results, _ = mapper_fn(partial(sum_potentials, 2), None, masking=True)
print(f"Result with exp = 2: {jnp.sum(results) : d}")
# Delete the reference to the Data Loader (optional)
release_fn()
""", """\
Result:  285
[ 10  45 285]
Result with exp = 2:  285
"""),
    # The page loads CIFAR-10 with tensorflow_datasets (a download); a pipeline of
    # the same features stands in for it, with a smaller cache (2 batches, not 100).
    "data_tensorflow_loader": ("""\
import numpy as onp
import tensorflow as tf
from jax import tree_util
from jax_sgmc import data
from jax_sgmc.data.tensorflow_loader import TensorflowDataLoader
# Helper function to look at the data provided
def show_data(data):
  for key, item in data.items():
    print(f"{key} with shape {item.shape} and dtype {item.dtype}")
pipeline = tf.data.Dataset.from_tensor_slices({
    "id": [b"%d" % i for i in range(2000)],
    "image": onp.zeros((2000, 32, 32, 3), onp.uint8),
    "label": onp.arange(2000) % 10,
})
data_loader = TensorflowDataLoader(pipeline, shuffle_cache=10, exclude_keys=['id'])
# If the model needs data for initialization, an all zero batch can be
# drawn with the correct shapes and dtypes
show_data(data_loader.initializer_batch(mb_size=1000))
data_init, data_batch, _ = data.random_reference_data(data_loader, 2, 1000)
init_state = data_init()
new_state, batch = data_batch(init_state)
show_data(batch)
""", """\
image with shape (1000, 32, 32, 3) and dtype uint8
label with shape (1000,) and dtype int32
image with shape (1000, 32, 32, 3) and dtype uint8
label with shape (1000,) and dtype int32
"""),
    "io_hdf5_collector": ("""\
import tempfile
tf = tempfile.TemporaryFile()
import h5py
from jax_sgmc import io
file = h5py.File(tf, "w") # Use a real file for real saving
data_collector = io.HDF5Collector(file)
saving = io.save(data_collector)
# ... use the solver ...
# Close the file
file.close()
""", ""),
    "io_save": ("""\
import jax.numpy as jnp
from jax.lax import scan
from jax_sgmc import io, scheduler
dc = io.MemoryCollector()
init_save, save, postprocess_save = io.save(dc)
def update(saving_state, it):
  saving_state = save(saving_state, jnp.mod(it, 2) == 0, {'iteration': it})
  return saving_state
# The information about the number of collected samples must be defined
# before the run
static_information = scheduler.static_information(samples_collected=3)
# The saving function must now the form of the sample which should be saved
saving_state = init_save({'iteration': jnp.array(0)}, {}, static_information)
final_state, _ = scan(update, saving_state, jnp.arange(5))
saved_samples = postprocess_save(final_state, None)
print(saved_samples)
""", """\
{'sample_count': Array(3, dtype=int32, weak_type=True), 'samples': {'iteration': array([0, 2, 4], dtype=int32)}}
"""),
    "io_no_save": ("""\
import jax.numpy as jnp
from jax.lax import scan
from jax_sgmc import io, scheduler
init_save, save, postprocess_save = io.no_save()
def update(saving_state, it):
  saving_state = save(saving_state, jnp.mod(it, 2) == 0, {'iteration': it})
  return saving_state
# The information about the number of collected samples must be defined
# before the run
static_information = scheduler.static_information(samples_collected=3)
# The saving function must now the form of the sample which should be saved
saving_state = init_save({'iteration': jnp.array(0)}, None, static_information)
final_state, _ = scan(update, saving_state, jnp.arange(5))
saved_samples = postprocess_save(final_state, None)
print(saved_samples)
""", """\
{'sample_count': Array(3, dtype=int32, weak_type=True), 'samples': {'iteration': Array([0, 2, 4], dtype=int32)}}
"""),
    "io_pytree_to_dict": ("""\
from jax_sgmc import io
some_tree = {'a': 0.0, 'b': {'b1': [0.0, 0.1], 'b2': 0.0}}
as_dict = io.pytree_to_dict(some_tree)
print(as_dict)
""", """\
{'a': 0.0, 'b': {'b1': {'list_element_0': 0.0, 'list_element_1': 0.1}, 'b2': 0.0}}
"""),
    "io_dict_to_pytree": ("""\
from jax_sgmc import io
some_tree = {'a': 0.0, 'b': {'b1': [0.0, 0.1], 'b2': 0.0}}
as_dict = io.pytree_to_dict(some_tree)
sub_pytree = io.dict_to_pytree(as_dict['b'], some_tree['b'])
print(sub_pytree)
""", """\
{'b1': [0.0, 0.1], 'b2': 0.0}
"""),
    # The page imports tree_leaves from jax itself, which JAX removed (0.6): it
    # is jax.tree_util's.
    "io_pytree_dict_keys": ("""\
from jax.tree_util import tree_leaves
from jax_sgmc import io
pytree = {"a": [0.0, 1.0], "b": 2.0}
pytree_as_dict = io.pytree_to_dict(pytree)
pytree_leaves = tree_leaves(pytree_as_dict)
pytree_keys = io.pytree_dict_keys(pytree_as_dict)
print(pytree_leaves)
print(pytree_keys)
""", """\
[0.0, 1.0, 2.0]
[('a', 'list_element_0'), ('a', 'list_element_1'), ('b',)]
"""),
}

_IMPORT = re.compile(r"^(\s*(?:from|import)\s+)jax_sgmc\b", re.M)


def with_compat_imports(code: str) -> str:
    """The example with only its imports of ``jax_sgmc`` changed to ``grainlike.compat.jax_sgmc``."""
    return _IMPORT.sub(r"\1grainlike.compat.jax_sgmc", code)


def run_example(code: str, tmp_path, monkeypatch) -> str:
    monkeypatch.chdir(tmp_path)
    out = stdio.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "example", "exec"), {"__name__": "example"})
    return out.getvalue()


def same_text(printed: str, shown: str) -> bool:
    # The pages' doctests compare with NORMALIZE_WHITESPACE: one page shows
    # continuation lines of an array indented differently from how numpy prints them.
    return printed.split() == shown.split()


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_documented_example_runs_with_compat_imports_and_prints_what_the_page_shows(name, tmp_path, monkeypatch):
    code, shown = EXAMPLES[name]
    if "import tensorflow" in code:
        pytest.importorskip("tensorflow", reason="tensorflow is in the dev extra")
    compat = with_compat_imports(code)
    assert "jax_sgmc" not in compat.replace("grainlike.compat.jax_sgmc", "")
    printed = run_example(compat, tmp_path, monkeypatch)
    assert same_text(printed, shown), printed


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_documented_example_prints_the_same_with_jaxsgmc_itself(ref, name, tmp_path, monkeypatch):
    # The transcription is checked against JaxSGMC: the same text, character for character.
    code, shown = EXAMPLES[name]
    if "import tensorflow" in code:
        pytest.importorskip("tensorflow_datasets", reason="JaxSGMC's loader imports tensorflow_datasets")
    printed = run_example(code, tmp_path, monkeypatch)
    assert same_text(printed, shown), printed
    assert run_example(with_compat_imports(code), tmp_path, monkeypatch) == printed


def test_import_grainlike_imports_no_compat_package():
    code = ("import sys, grainlike\n"
            "grainlike.io, grainlike.reference_data\n"
            "assert not [m for m in sys.modules if m.startswith('grainlike.compat')], 'compat imported'\n"
            "import grainlike.compat.jax_sgmc\n"
            "assert 'jax' not in sys.modules, 'the package itself imports jax'\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stderr
