"""grainlike.io.save round-trips any JAX pytree: namedtuples, dataclasses, flax structs, nested containers.

With or without a dictionize rule, the samples come back in the saved tree's own
structure, every leaf with its samples (never an object array, never a leaf lost),
and the collectors' files name the leaves by ``pytree_dict_keys``.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grainlike import io

pytestmark = pytest.mark.timeout(180)


class Params(NamedTuple):
    a: jax.Array
    b: jax.Array


class Unsorted(NamedTuple):
    # Fields not in sorted order: a dict of them flattens in another order than the tuple.
    z: jax.Array
    a: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Layer:
    w: jax.Array
    b: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class RuledLayer:
    w: jax.Array
    b: jax.Array


@io.register_dictionize_rule(RuledLayer)
def _ruled_layer(node):
    # Listed in the other order than JAX flattens them: names must still match leaves.
    return [("bias", node.b), ("weights", node.w)]


class Opaque:
    """A pytree node whose constructor checks its children (the rules cannot run on stand-ins)."""

    def __init__(self, x, y):
        if not hasattr(x, "shape"):
            raise TypeError("Opaque takes arrays")
        self.x, self.y = x, y


jax.tree_util.register_pytree_node(Opaque, lambda o: ((o.x, o.y), None), lambda _, c: Opaque(*c))


@io.register_dictionize_rule(Opaque)
def _opaque(node):
    return [("second", node.y), ("first", node.x)]


def _trees() -> dict:
    f, v = jnp.float32(0), jnp.zeros(2, jnp.float32)
    trees = {
        "namedtuple": Params(f, v),
        "unsorted_namedtuple": Unsorted(f, v),
        "dataclass": Layer(v, f),
        "dataclass_with_rule": RuledLayer(v, f),
        "node_with_rule_on_arrays": Opaque(v, f),
        "nested": {"p": [Params(f, (v, {"z": f, "a": v})), Layer(f, f)], "n": None, "t": (f,)},
        "long_list": [f] * 12,
        "bare_array": v,
    }
    try:
        from flax import struct
    except ImportError:  # pragma: no cover - flax is in the dev extra
        return trees

    @struct.dataclass
    class FlaxParams:
        kernel: jax.Array
        bias: jax.Array
        name: str = struct.field(pytree_node=False, default="dense")

    trees["flax_struct"] = FlaxParams(v, f)
    return trees


TREES = _trees()
EXPECTED_NAMES = {
    "namedtuple": ["a", "b"],
    "unsorted_namedtuple": ["z", "a"],
    "dataclass": ["unknown~pytree~leaf~0", "unknown~pytree~leaf~1"],
    "dataclass_with_rule": ["weights", "bias"],
    "node_with_rule_on_arrays": ["first", "second"],
    "nested": ["p/list_element_0/a", "p/list_element_0/b/list_element_0", "p/list_element_0/b/list_element_1/a",
               "p/list_element_0/b/list_element_1/z", "p/list_element_1/unknown~pytree~leaf~0",
               "p/list_element_1/unknown~pytree~leaf~1", "t/list_element_0"],
    "long_list": [f"list_element_{i}" for i in range(12)],
    "bare_array": [""],
    "flax_struct": ["unknown~pytree~leaf~0", "unknown~pytree~leaf~1"],
}


def _sample(tree, i):
    """The tree with every leaf filled with a value of its own: step i, leaf k."""
    leaves, treedef = jax.tree.flatten(tree)
    return jax.tree.unflatten(treedef, [jnp.full(jnp.shape(x), 100 * k + i, jnp.result_type(x))
                                        for k, x in enumerate(leaves)])


def _save_three(tree, collector):
    init_save, save, postprocess_save = io.save(collector)
    state = init_save(tree, {}, 3)

    def update(state, i):
        state, _ = save(state, True, _sample(tree, i))
        return state, None

    final = jax.jit(lambda s: jax.lax.scan(update, s, jnp.arange(3))[0])(state)
    return postprocess_save(final, None)


def _assert_holds_the_three_samples(tree, samples):
    assert jax.tree.structure(samples) == jax.tree.structure(tree)
    leaves = jax.tree.leaves(samples)
    assert len(leaves) == len(jax.tree.leaves(tree))
    for k, (leaf, template) in enumerate(zip(leaves, jax.tree.leaves(tree))):
        leaf = np.asarray(leaf)
        assert leaf.dtype != object and leaf.shape == (3,) + jnp.shape(template)
        for i in range(3):
            assert np.all(leaf[i] == 100 * k + i), (k, i, leaf)


@pytest.mark.parametrize("name", sorted(TREES))
def test_memory_collector_returns_every_leaf_in_the_saved_trees_structure(name, tmp_path):
    tree = TREES[name]
    out = _save_three(tree, io.MemoryCollector(save_dir=str(tmp_path)))
    assert int(out["sample_count"]) == 3
    _assert_holds_the_three_samples(tree, out["samples"])
    with np.load(tmp_path / "chain_0.npz") as f:
        names = [n or "sample" for n in EXPECTED_NAMES[name]]
        assert sorted(f.files) == sorted(names)
        for k, n in enumerate(names):
            assert f[n].tolist() == np.asarray(jax.tree.leaves(out["samples"])[k]).tolist()


@pytest.mark.parametrize("name", sorted(TREES))
def test_hdf5_collector_names_each_leafs_dataset_by_its_key_path(name, tmp_path):
    h5py = pytest.importorskip("h5py", reason="h5py is in the hdf5 extra")
    tree = TREES[name]
    with h5py.File(tmp_path / "samples.h5", "w") as f:
        out = _save_three(tree, io.HDF5Collector(f))
        _assert_holds_the_three_samples(tree, jax.tree.map(np.asarray, out["samples"]))
        for k, n in enumerate(EXPECTED_NAMES[name]):
            dataset = f[f"/chain~0/{n}".rstrip("/")]
            assert dataset[:].tolist() == np.asarray(jax.tree.leaves(out["samples"])[k]).tolist()


@pytest.mark.parametrize("name", sorted(TREES))
def test_dict_form_names_each_leaf_and_comes_back_whole(name):
    tree = _sample(TREES[name], 7)
    keys = io.pytree_dict_keys(tree)
    assert ["/".join(map(str, k)) for k in keys] == EXPECTED_NAMES[name]
    as_dict = io.pytree_to_dict(tree)
    for key, leaf in zip(keys, jax.tree.leaves(tree)):
        node = as_dict
        for part in key:
            node = node[part]
        assert node is leaf
    back = io.dict_to_pytree(as_dict, tree)
    assert jax.tree.structure(back) == jax.tree.structure(tree)
    assert all(x is y for x, y in zip(jax.tree.leaves(back), jax.tree.leaves(tree)))


def test_a_rule_that_leaves_out_a_leaf_is_an_error_not_a_silent_loss():
    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Half:
        kept: jax.Array
        dropped: jax.Array

    @io.register_dictionize_rule(Half)
    def _half(node):
        return [("kept", node.kept)]

    tree = {"h": Half(jnp.zeros(2), jnp.zeros(3))}
    with pytest.raises(ValueError, match="leaves out 1 of the tree's 2 leaves"):
        io.pytree_dict_keys(tree)
    # Samples held in memory need no names: they come back whole.
    _assert_holds_the_three_samples(tree, _save_three(tree, io.MemoryCollector())["samples"])


def test_a_rule_that_names_two_leaves_alike_is_an_error():
    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Twins:
        a: jax.Array
        b: jax.Array

    @io.register_dictionize_rule(Twins)
    def _twins(node):
        return [("x", node.a), ("y", {"x": node.b})]

    assert io.pytree_dict_keys(Twins(0.0, 1.0)) == [("x",), ("y", "x")]

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Copies:
        a: jax.Array

    @io.register_dictionize_rule(Copies)
    def _copies(node):
        return [("first", node.a), ("again", node.a)]

    with pytest.raises(ValueError, match="names leaf 0 twice"):
        io.pytree_dict_keys(Copies(jnp.zeros(1)))


def test_checkpoint_carry_of_any_pytree_comes_back_from_load(tmp_path):
    carry = {"params": Params(jnp.float32(1), jnp.arange(2.0)), "layer": Layer(jnp.ones(2), jnp.float32(3))}
    init_save, save, post = io.save(io.MemoryCollector(), checkpoint_every=1, checkpoint_dir=str(tmp_path))
    state = init_save({"x": jnp.float32(0)}, carry, 1)
    state, _ = jax.jit(lambda s: save(s, True, {"x": jnp.float32(5)}, checkpoint=carry))(state)
    post(state)
    checkpoint = io.load(str(tmp_path), carry)
    assert jax.tree.structure(checkpoint.carry) == jax.tree.structure(carry)
    assert [np.asarray(x).tolist() for x in jax.tree.leaves(checkpoint.carry)] == [
        np.asarray(x).tolist() for x in jax.tree.leaves(carry)]
    assert checkpoint.arrays["sample:x"].tolist() == [5.0]


class RuledPair(NamedTuple):
    first: jax.Array
    second: jax.Array


@io.register_dictionize_rule(RuledPair)
def _ruled_pair(node):
    return [("x", node.first), ("y", node.second)]


def test_a_rule_for_a_namedtuple_saves_every_field_and_names_them_as_jaxsgmc_does(tmp_path):
    # JaxSGMC tries the rules of dict, list and tuple first: a namedtuple is named by
    # its fields whatever rule is registered for it.
    tree = RuledPair(jnp.float32(0), jnp.zeros(3, jnp.int32))
    assert io.pytree_dict_keys(tree) == [("first",), ("second",)]
    out = _save_three(tree, io.MemoryCollector(save_dir=str(tmp_path)))
    _assert_holds_the_three_samples(tree, out["samples"])
    assert type(out["samples"]) is RuledPair
    with np.load(tmp_path / "chain_0.npz") as f:
        assert sorted(f.files) == ["first", "second"]
