"""Batch stacking of nested structures."""

import collections
import dataclasses

import numpy as np
import pytest

from grainlike.core import tree


def test_stacks_nested_dicts_tuples_lists_and_scalars():
    Pair = collections.namedtuple("Pair", "a b")
    values = [
        {"img": np.full((2, 2), i, np.uint8), "meta": (i, float(i)), "l": [np.int32(i)], "p": Pair(i, b"x")}
        for i in range(3)
    ]
    out = tree.stack(values)
    assert out["img"].shape == (3, 2, 2) and out["img"].dtype == np.uint8
    assert out["img"][:, 0, 0].tolist() == [0, 1, 2]
    assert isinstance(out["meta"], tuple) and out["meta"][0].tolist() == [0, 1, 2]
    assert out["meta"][1].dtype == np.float64
    assert isinstance(out["l"], list) and out["l"][0].dtype == np.int32
    assert isinstance(out["p"], Pair) and out["p"].b.tolist() == [b"x"] * 3


def test_single_element_gets_leading_axis():
    out = tree.stack([{"x": np.arange(3)}])
    assert out["x"].shape == (1, 3)


def test_allocator_receives_each_array_leaf():
    calls = []

    def alloc(shape, dtype):
        calls.append((shape, dtype))
        return np.empty(shape, dtype)

    out = tree.stack([{"a": np.ones(4, np.float32), "b": np.zeros(2)} for _ in range(5)], alloc)
    assert sorted(calls, key=str) == sorted([((5, 4), np.dtype(np.float32)), ((5, 2), np.dtype(np.float64))], key=str)
    assert out["a"].sum() == 20


@pytest.mark.parametrize(
    "values, fragment",
    [
        ([{"a": 1}, {"b": 1}], "dict keys differ"),
        ([(1, 2), (1,)], "tuple of length 2"),
        ([np.zeros(3), np.zeros(4)], "same shape"),
        ([{"a": np.zeros(2)}, {"a": np.zeros((2, 2))}], "['a']"),
    ],
)
def test_mismatched_elements_name_the_place_and_show_every_structure(values, fragment):
    with pytest.raises(ValueError) as info:
        tree.stack(values)
    msg = str(info.value)
    assert fragment in msg
    assert "element 0" in msg and "element 1" in msg


def test_empty_list_is_refused():
    with pytest.raises(ValueError, match="empty"):
        tree.stack([])


# -- the walking functions -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Example:
    image: np.ndarray
    label: int

    def __post_init__(self):
        # Fails for a stacked label: proves rebuilding does not re-run it.
        if np.ndim(self.label) != 0:
            raise ValueError("label must be a scalar")


Pair = collections.namedtuple("Pair", "a b")


class Tagged(dict):
    pass


def _all_kinds(i=0):
    dd = collections.defaultdict(list)
    dd["d"] = np.float32(i)
    return {
        "arr": np.full((2,), i, np.int16),
        "seq": [i, (b"x", "s")],
        "pair": Pair(np.int64(i), None),
        "ex": Example(np.zeros(3) + i, i),
        "tagged": Tagged(t=i),
        "dd": dd,
        "none": None,
    }


def test_flatten_walks_every_node_kind_in_insertion_order():
    leaves = tree.flatten(_all_kinds(1))
    assert [type(x).__name__ for x in leaves] == [
        "ndarray", "int", "bytes", "str", "int64", "ndarray", "int", "int", "float32",
    ]
    paths = [p for p, _ in tree.flatten_with_path(_all_kinds())]
    assert paths == [
        "['arr']", "['seq'][0]", "['seq'][1][0]", "['seq'][1][1]", "['pair'][0]",
        "['ex'].image", "['ex'].label", "['tagged']['t']", "['dd']['d']",
    ]


def test_unflatten_as_inverts_flatten_and_keeps_node_types():
    t = _all_kinds(2)
    back = tree.unflatten_as(t, tree.flatten(t))
    assert type(back["pair"]) is Pair and back["pair"].b is None
    assert type(back["tagged"]) is Tagged and type(back["ex"]) is Example
    assert type(back["dd"]) is collections.defaultdict and back["dd"].default_factory is list
    assert back["seq"] == [2, (b"x", "s")]
    with pytest.raises(ValueError, match="fewer"):
        tree.unflatten_as(t, tree.flatten(t)[:-1])
    with pytest.raises(ValueError, match="more"):
        tree.unflatten_as(t, tree.flatten(t) + [0])


def test_map_structure_zips_trees_and_names_where_they_differ():
    out = tree.map_structure(lambda a, b: a + b, {"x": [1, 2]}, {"x": [10, 20]})
    assert out == {"x": [11, 22]}
    with pytest.raises(tree.StructureError, match=r"at \['x'\]: expected list of length 2"):
        tree.map_structure(lambda a, b: a, {"x": [1, 2]}, {"x": [1]})
    with pytest.raises(tree.StructureError, match=r"at \['x'\]\[1\]: expected a leaf, got dict"):
        tree.map_structure(lambda a, b: a, {"x": [1, 2]}, {"x": [1, {"y": 2}]})
    with pytest.raises(ValueError, match="dict keys differ"):
        tree.map_structure(lambda a, b: a, {"x": 1}, {"y": 1})
    paths = []
    tree.map_structure_with_path(lambda p, x: paths.append(p), {"a": Example(1, 2)})
    assert paths == ["['a'].image", "['a'].label"]


def test_is_leaf_stops_the_walk():
    out = tree.map_structure(
        lambda x: len(x) if isinstance(x, list) else -x,
        {"a": [1, 2, 3], "b": (4,)},
        is_leaf=lambda x: isinstance(x, list),
    )
    assert out == {"a": 3, "b": (-4,)}


def test_zeros_like_keeps_structure_shapes_and_dtypes():
    z = tree.zeros_like(_all_kinds(5))
    assert z["arr"].dtype == np.int16 and z["arr"].tolist() == [0, 0]
    assert z["ex"].image.tolist() == [0, 0, 0] and z["seq"][1][0] == b""
    assert z["pair"].b is None and type(z["dd"]) is collections.defaultdict


def test_estimate_nbytes_counts_arrays_and_strings():
    assert tree.estimate_nbytes(np.zeros(10, np.float32)) == 40
    assert tree.estimate_nbytes(b"abc") == 3
    assert tree.estimate_nbytes({"a": np.zeros(4, np.uint8), "b": [b"xy", 7], "c": None}) == 4 + 2 + 8


def test_stack_walks_dataclasses_subclasses_and_keeps_none():
    out = tree.stack([_all_kinds(i) for i in range(3)])
    assert type(out["ex"]) is Example and out["ex"].label.tolist() == [0, 1, 2]
    assert out["ex"].image.shape == (3, 3)
    assert type(out["tagged"]) is Tagged and out["tagged"]["t"].tolist() == [0, 1, 2]
    assert type(out["dd"]) is collections.defaultdict and out["dd"]["d"].dtype == np.float32
    assert out["none"] is None and out["pair"].b is None
    with pytest.raises(ValueError, match=r"cannot stack the elements at \['none'\]: expected None"):
        tree.stack([{"none": None}, {"none": 1}])
    with pytest.raises(ValueError, match=r"at \['a'\]: expected a leaf, got dict"):
        tree.stack([{"a": 1}, {"a": {"b": 1}}])
    # Object leaves (no node among them) still stack, into an object array.
    assert tree.stack([{"a": object()}, {"a": object()}])["a"].dtype == object


# -- against grain's tree functions -----------------------------------------------------


@pytest.fixture(scope="module")
def grain_tree_lib():
    import absl.flags

    absl.flags.FLAGS.mark_as_parsed()
    from grain._src.core import tree_lib

    return tree_lib


SPEC_CASES = [
    {"a": 1, "b": [1, 2, 3], "c": (1, "x"), "d": np.zeros((2, 3), np.float32)},
    {"next_index": 4, "parent": {"pos": [0, 1], "rng": None}},
    b'{"version": 2}',
    [np.int64(3), 2.5, b"x"],
    {"ex": Example(np.zeros(2), 1), "pair": Pair(1, 2), "empty": []},
]


@pytest.mark.parametrize("value", SPEC_CASES, ids=range(len(SPEC_CASES)))
def test_spec_like_equals_grains(grain_tree_lib, value):
    assert tree.spec_like(value) == grain_tree_lib.spec_like(value)


PLAIN_CASES = [SPEC_CASES[0], SPEC_CASES[1], SPEC_CASES[3], {"pair": Pair([1, None], 2), "z": []}]


@pytest.mark.parametrize("value", PLAIN_CASES, ids=range(len(PLAIN_CASES)))
def test_flatten_and_map_agree_with_grains_on_plain_trees(grain_tree_lib, value):
    # grain walks dicts in sorted key order; the cases use sorted keys. (It treats
    # dataclasses as leaves, where grainlike walks into them.)
    assert [type(x) for x in tree.flatten(value)] == [type(x) for x in grain_tree_lib.flatten(value)]
    assert tree.map_structure(str, value) == grain_tree_lib.map_structure(str, value)


def _grain_key(entry):
    # grain (with jax present) gives jax key entries: DictKey(.key), SequenceKey(.idx).
    return getattr(entry, "key", getattr(entry, "idx", entry))


# Without namedtuples: with jax present grain names a namedtuple's field
# (GetAttrKey), without jax it gives the index, as grainlike does.
@pytest.mark.parametrize("value", PLAIN_CASES[:3], ids=range(3))
def test_key_paths_equal_grains_tree_lib_paths(grain_tree_lib, value):
    from grainlike.core import tree_lib

    theirs = [(tuple(_grain_key(k) for k in p), x) for p, x in grain_tree_lib.flatten_with_path(value)]
    assert tree_lib.flatten_with_path(value) == theirs
    collect = lambda p, x: (tuple(_grain_key(k) for k in p), x)  # noqa: E731
    assert tree_lib.map_structure_with_path(collect, value) == grain_tree_lib.map_structure_with_path(collect, value)
    assert tree_lib.flatten_with_path(np.int8(3)) == [((), np.int8(3))]


def test_assert_same_structure_accepts_other_leaves_and_names_the_difference():
    tree.assert_same_structure({"b": [1, 2], "a": None}, {"a": None, "b": ["x", np.zeros(2)]})
    with pytest.raises(tree.StructureError, match=r"at \['b'\]: expected list of length 2"):
        tree.assert_same_structure({"b": [1, 2]}, {"b": [1]})
    with pytest.raises(tree.StructureError, match=r"at \['b'\]\[0\]: expected a leaf, got dict"):
        tree.assert_same_structure({"b": [1]}, {"b": [{"c": 1}]})
    with pytest.raises(tree.StructureError, match=r"expected a dict, got a leaf \(int\)"):
        tree.assert_same_structure({"b": 1}, 1)


@pytest.mark.parametrize(
    "value",
    [b"serialized", np.arange(3, dtype=np.int32), 1, {"a": "v2", "b": 1.5, "c": [np.zeros(2, np.float32), b"xy"]}],
    ids=["bytes", "array", "int", "nested"],
)
def test_estimate_byte_size_equals_grains(grain_tree_lib, value):
    assert tree.estimate_byte_size(value) == grain_tree_lib.estimate_byte_size(value)


STACK_CASES = [
    lambda i: {"b": i, "a": np.full((2,), i, np.float32)},
    lambda i: {"x": None, "y": [i, (np.int8(i), b"s")]},
    lambda i: Pair(np.arange(3) + i, "str"),
    lambda i: [collections.OrderedDict(z=i, y=float(i))],
]


@pytest.mark.parametrize("make", STACK_CASES, ids=range(len(STACK_CASES)))
def test_stack_equals_grains_make_batch(grain_tree_lib, make):
    from grain._src.python.dataset.transformations.batch import make_batch

    values = [make(i) for i in range(3)]
    ours, theirs = tree.stack(values), make_batch(values)
    assert type(ours) is type(theirs)
    assert tree.map_structure(lambda x: (x.dtype, x.shape), ours) == tree.map_structure(
        lambda x: (x.dtype, x.shape), theirs
    )
    np.testing.assert_equal(ours, theirs)
    assert tree.map_structure(type, ours) == tree.map_structure(type, theirs)


import collections
import dataclasses

from grainlike.core.tree import Stacker, stack


@dataclasses.dataclass
class _Pair:
    a: np.ndarray
    b: np.generic


_Point = collections.namedtuple("_Point", "x y")


def _elements(i):
    return {
        "arr": np.arange(6, dtype=np.float32).reshape(2, 3) + i,
        "scalar": np.int16(i),
        "zero_d": np.array(i * 2.5),
        "nested": (_Point(np.uint8(i), np.array([i, i])), [np.bool_(i % 2)]),
        "none": None,
        "pair": _Pair(np.full(4, i), np.float64(i)),
    }


def _same(x, y):
    assert type(x) is type(y)
    if isinstance(x, np.ndarray) or isinstance(x, np.generic):
        assert x.dtype == y.dtype and np.shape(x) == np.shape(y)
        np.testing.assert_array_equal(x, y)
    elif isinstance(x, dict):
        assert list(x) == list(y)
        for k in x:
            _same(x[k], y[k])
    elif dataclasses.is_dataclass(x):
        for f in dataclasses.fields(x):
            _same(getattr(x, f.name), getattr(y, f.name))
    elif isinstance(x, (list, tuple)):
        assert len(x) == len(y)
        for a, b in zip(x, y):
            _same(a, b)
    else:
        assert x == y


def test_stacker_builds_what_stack_builds_and_gives_back_each_element():
    elements = [_elements(i) for i in range(5)]
    stacker = Stacker(5)
    stacker.add(elements, 0, 2)
    stacker.add(elements, 2)
    assert stacker.active and stacker.count == 5
    _same(stacker.result(), stack(elements))
    for i, e in enumerate(elements):
        _same(stacker.element(i), e)


def test_stacker_allocates_the_batch_leaves_with_alloc():
    made = []

    def alloc(shape, dtype):
        made.append((shape, np.dtype(dtype)))
        return np.empty(shape, dtype)

    stacker = Stacker(3, alloc)
    stacker.add([{"a": np.zeros((2, 2), np.int8), "b": np.float32(1)}] * 3)
    assert made == [((3, 2, 2), np.dtype(np.int8)), ((3,), np.dtype(np.float32))]
    assert stacker.result()["a"].shape == (3, 2, 2)


@pytest.mark.parametrize(
    "later, unsuitable",
    [
        ({"a": np.zeros(3, np.int64)}, False),  # another shape
        ({"a": np.zeros(2, np.int32)}, False),  # another dtype
        ({"b": np.zeros(2, np.int64)}, False),  # another key
        ({"a": [0, 0]}, False),  # a node where a leaf was
    ],
)
def test_stacker_turns_off_at_an_element_that_does_not_fit(later, unsuitable):
    stacker = Stacker(3)
    stacker.add([{"a": np.zeros(2, np.int64)}, later, {"a": np.zeros(2, np.int64)}])
    assert not stacker.active and stacker.unsuitable is unsuitable
    assert stacker.count == 1 and stacker.result() is None


@pytest.mark.parametrize("first", [{"a": 1}, {"a": "text"}, {"a": np.array([object()])}, {}, None])
def test_stacker_leaves_other_elements_to_stack(first):
    stacker = Stacker(2)
    stacker.add([first, first])
    assert not stacker.active and stacker.unsuitable and stacker.result() is None


def test_stacker_result_needs_a_full_batch():
    stacker = Stacker(3)
    stacker.add([np.zeros(2)] * 2)
    assert stacker.active and stacker.result() is None


def test_stacker_leaves_elements_below_min_bytes_to_stack():
    small = Stacker(2, min_bytes=1024)
    small.add([np.zeros(127)] * 2)  # 1016 bytes
    assert not small.active and small.unsuitable
    big = Stacker(2, min_bytes=1024)
    big.add([np.zeros(128)] * 2)
    assert big.result().shape == (2, 128)
