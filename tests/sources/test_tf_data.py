"""A finite tf.data.Dataset as a random-access source (``TfDataSource``), and TensorFlow loaded only by its user.

The expected records are TensorFlow's own: ``list(dataset.as_numpy_iterator())``.
The pipelines shuffle with ``reshuffle_each_iteration=False``, so every iteration
of them yields that list.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import grainlike as grain
from grainlike.experimental import assert_equal_output_after_checkpoint
from grainlike.sources import TfDataSource
from grainlike.sources.tf_data import is_tf_dataset

tf = pytest.importorskip("tensorflow")

N = 24


def _pipeline():
    """JaxSGMC's kind of input: dict features (a string id among them), a map, a seeded shuffle."""
    features = {
        "image": np.arange(N * 6, dtype=np.uint8).reshape(N, 2, 3),
        "label": np.arange(N, dtype=np.int64) % 5,
        "id": [f"rec-{i}".encode() for i in range(N)],
    }
    ds = tf.data.Dataset.from_tensor_slices(features)
    ds = ds.map(lambda e: {**e, "scaled": tf.cast(e["image"], tf.float32) / 255.0})
    return ds.shuffle(N, seed=7, reshuffle_each_iteration=False)


def _equal(a, b) -> bool:
    try:
        np.testing.assert_equal(a, b)
    except AssertionError:
        return False
    return True


def test_records_are_the_pipelines_elements_in_its_order():
    ds = _pipeline()
    expected = list(ds.as_numpy_iterator())
    source = TfDataSource(ds)
    assert len(source) == N
    np.testing.assert_equal([source[i] for i in range(N)], expected)
    np.testing.assert_equal(source.__getitems__([5, 0, 5, 23]), [expected[k] for k in (5, 0, 5, 23)])
    assert isinstance(source[0]["id"], bytes)  # strings stay bytes, exactly
    assert source[3]["scaled"].dtype == np.float32


def test_map_dataset_source_takes_the_dataset_itself():
    ds = _pipeline()
    expected = list(ds.as_numpy_iterator())
    np.testing.assert_equal(list(grain.MapDataset.source(ds)), expected)
    np.testing.assert_equal(list(grain.MapDataset.source(ds).shuffle(seed=3)),
                            list(grain.MapDataset.source(TfDataSource(ds)).shuffle(seed=3)))


def test_shapes_unknown_to_tensorflow_are_read_element_by_element():
    # A filter makes the count unknown; from_generator makes the shapes unknown.
    gen = tf.data.Dataset.from_generator(
        lambda: ({"x": np.full(3, i), "s": b"a\x00" * i} for i in range(7)),
        output_signature={"x": tf.TensorSpec([None], tf.int64), "s": tf.TensorSpec([], tf.string)},
    ).filter(lambda e: e["x"][0] % 2 == 0)
    source = TfDataSource(gen)
    np.testing.assert_equal([source[i] for i in range(len(source))], list(gen.as_numpy_iterator()))
    assert source[3]["s"] == b"a\x00" * 6  # trailing NULs kept (numpy's S dtype would drop them)


def test_repr_names_the_data_without_addresses():
    assert repr(TfDataSource(_pipeline(), exclude_keys=["id"])) == (
        "TfDataSource(len=24, element_spec={'image': 'uint8[2, 3]', 'label': 'int64[]', 'scaled': 'float32[2, 3]'})"
    )


def test_exclude_keys_drops_them_before_reading():
    source = TfDataSource(_pipeline(), exclude_keys=["id", "scaled"])
    assert sorted(source[0]) == ["image", "label"]
    with pytest.raises(KeyError, match=r"exclude_keys \['nope'\] are not keys of the elements; they have \['id', 'image', 'label', 'scaled'\]"):
        TfDataSource(_pipeline(), exclude_keys=["nope"])
    with pytest.raises(TypeError, match="needs dict elements"):
        TfDataSource(tf.data.Dataset.range(3), exclude_keys=["id"])


def test_exclude_keys_leaves_no_file_in_tmpdir(tmp_path, monkeypatch):
    # tf.data traces the function that drops the keys; autograph, if let convert
    # it, writes a source file into TMPDIR and never removes it.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    source = TfDataSource(_pipeline(), exclude_keys=["id"])
    assert sorted(source[0]) == ["image", "label", "scaled"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: tf.data.Dataset.range(3).repeat(), r"infinite \(cardinality\(\) == INFINITE.*\.take\(n\).*TfDataIterDataset"),
        (
            lambda: tf.data.Dataset.from_tensor_slices({"tokens": tf.ragged.constant([[1], [2, 3]])}),
            r"\['tokens'\] is a RaggedTensorSpec: each leaf must be a dense tensor",
        ),
        (
            lambda: tf.data.Dataset.from_generator(
                lambda: (np.zeros(i) for i in (2, 2, 3)), output_signature=tf.TensorSpec([None], tf.float64)
            ),
            r"has shape \(2,\) in element 0 and \(3,\) in element 2",
        ),
        (lambda: tf.data.Dataset.range(0), "has no elements"),
    ],
    ids=["infinite", "ragged", "shapes-differ", "empty"],
)
def test_datasets_that_cannot_be_random_access_are_refused_naming_why(make, message):
    with pytest.raises(ValueError, match=message):
        TfDataSource(make())


def test_more_bytes_than_max_bytes_is_refused_with_the_count():
    with pytest.raises(ValueError, match=r"the first 24 elements already hold \d+ bytes, more than max_bytes=1000"):
        TfDataSource(_pipeline(), max_bytes=1000)


def test_a_non_dataset_is_refused():
    assert not is_tf_dataset([1, 2]) and not is_tf_dataset(tf.constant([1, 2]))
    assert is_tf_dataset(_pipeline()) and is_tf_dataset(tf.compat.v1.data.Dataset.range(2))
    with pytest.raises(TypeError, match="TfDataSource takes a tf.data.Dataset, got list"):
        TfDataSource([1, 2])


def test_source_pickles_without_tensorflow():
    code = (
        "import pickle, sys; source = pickle.loads(sys.stdin.buffer.read()); "
        "print(len(source), source[2]['label'], 'tensorflow' in sys.modules)"
    )
    data = pickle.dumps(TfDataSource(_pipeline()))
    out = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, check=True, timeout=60)
    expected = list(_pipeline().as_numpy_iterator())[2]["label"]
    assert out.stdout.decode().split() == ["24", str(expected), "False"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [0, 2])
def test_data_loader_over_a_dataset_reads_as_over_its_elements_and_restores_at_every_step(workers):
    ds = _pipeline().map(lambda e: {"image": e["image"], "label": e["label"]})
    elements = list(ds.as_numpy_iterator())

    def loader(source, worker_count):
        return grain.DataLoader(
            data_source=source,
            sampler=grain.IndexSampler(N, grain.NoSharding(), shuffle=True, num_epochs=1, seed=3),
            operations=[grain.Batch(5)],
            worker_count=worker_count,
        )

    from_tf = loader(ds, workers)  # the dataset itself: read once into a TfDataSource
    assert isinstance(from_tf.data_source, TfDataSource)
    # With workers each worker batches its own records (grain's DataLoader): compare like with like.
    expected = list(loader(elements, workers))
    np.testing.assert_equal(list(from_tf), expected)
    if workers == 0:
        assert_equal_output_after_checkpoint(from_tf)
    else:
        # Each restore starts 2 workers: one restore mid-way, not one per step.
        it = iter(from_tf)
        batches = [next(it) for _ in range(2)]
        state = it.get_state()
        rest = list(it)
        restored = iter(from_tf)
        restored.set_state(state)
        np.testing.assert_equal(list(restored), rest)
        np.testing.assert_equal(batches + rest, expected)


@pytest.mark.timeout(300)
def test_workers_read_a_tf_data_source_without_importing_tensorflow():
    loader = (
        grain.loader(_pipeline())
        .map(lambda e: {"label": e["label"], "tf": np.int8("tensorflow" in sys.modules)})
        .batch(N)
        .workers(2)
        .build()
    )
    batches = list(loader)  # one per worker: each batches its own records
    assert len(batches) == 2 and not any(b["tf"].any() for b in batches)
    assert sorted(np.concatenate([b["label"] for b in batches]).tolist()) == sorted(e["label"] for e in _pipeline().as_numpy_iterator())


def test_reference_data_as_jaxsgmc_tensorflow_data_loader():
    """JaxSGMC: ``random_reference_data(TensorflowDataLoader(pipeline, exclude_keys=['id']), cache, mb)``."""
    jax = pytest.importorskip("jax")
    source = TfDataSource(_pipeline(), exclude_keys=["id"])
    data = grain.reference_data(source, cache_size=3, batch_size=4)
    state = data.init(shuffle=True, in_epochs=True, seed=1)
    step = jax.jit(data.next)
    seen = []
    for _ in range(N // 4):
        state, batch, info = step(state)
        assert bool(info.mask.all())
        assert batch["scaled"].dtype == np.float32 and batch["image"].shape == (4, 2, 3)
        seen += [tuple(np.asarray(img).ravel()) for img in batch["image"]]
    # One epoch: every record once.
    assert sorted(seen) == sorted(tuple(source[i]["image"].ravel()) for i in range(N))
    checkpoint = data.get_state(state)
    state, after, _ = step(data.restore(checkpoint))
    state2, again, _ = step(data.restore(checkpoint))
    np.testing.assert_equal(jax.device_get(after), jax.device_get(again))
    data.release()


def test_reference_data_takes_a_dataset_of_numbers_as_it_is():
    jax = pytest.importorskip("jax")
    ds = tf.data.Dataset.from_tensor_slices({"x": np.arange(10, dtype=np.float32)})
    data = grain.reference_data(ds, cache_size=2, batch_size=5)
    state = data.init(shuffle=True, in_epochs=True)
    state, first, _ = jax.jit(data.next)(state)
    state, second, _ = jax.jit(data.next)(state)
    assert sorted(np.concatenate([first["x"], second["x"]]).tolist()) == list(range(10))
    data.release()


def test_full_reference_data_maps_over_every_element_of_a_dataset():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    ds = tf.data.Dataset.from_tensor_slices({"x": np.arange(10, dtype=np.float32)}).map(lambda e: {"x": e["x"] + 1})
    full = grain.full_reference_data(ds, cache_size=2, batch_size=4)
    state = full.init()
    state, (sums, _) = full.map(lambda b, m, c: (jnp.sum(m * b["x"]), c), state, None, masking=True)
    assert float(jnp.sum(sums)) == sum(range(1, 11))


def test_grainlike_imports_no_tensorflow_until_given_a_dataset():
    code = (
        "import sys, grainlike, grainlike.sources, grainlike.experimental, grainlike.builder; "
        "from grainlike.sources.tf_data import is_tf_dataset; "
        "loader = grainlike.loader(list(range(5))).batch(2).build(); list(loader); "
        "assert not is_tf_dataset(loader); "
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
