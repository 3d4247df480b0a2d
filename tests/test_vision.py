"""Tests for grainlike.vision: shapes, values, randomness, errors, pickling, a pipeline."""

from __future__ import annotations

import pickle
import random
import subprocess
import sys

import cloudpickle
import numpy as np
import pytest

cv2 = pytest.importorskip("cv2", reason="grainlike.vision needs opencv-python-headless (grainlike[vision])")

import grainlike as grain  # noqa: E402
from grainlike.vision import (  # noqa: E402
    Cast,
    CenterCrop,
    Decode,
    Normalize,
    RandomCrop,
    RandomFlip,
    Resize,
    ResizeAndCrop,
)


def rng_for(key: int) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(key=key))


def random_image(h: int, w: int, c: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, c), dtype=np.uint8)


def encode(ext: str, image_rgb: np.ndarray, *params: int) -> bytes:
    bgr = image_rgb[..., ::-1] if image_rgb.ndim == 3 and image_rgb.shape[2] == 3 else image_rgb
    ok, buf = cv2.imencode(ext, np.ascontiguousarray(bgr), list(params))
    assert ok
    return buf.tobytes()


# --- import cost -------------------------------------------------------------


def test_import_and_construction_do_not_import_cv2():
    code = (
        "import sys, pickle\n"
        "import grainlike, grainlike.vision as v\n"
        "ts = [v.Decode(key='image'), v.Resize((4, 5)), v.Resize(4, keep_aspect=True, interpolation='area'),\n"
        "      v.CenterCrop(2), v.RandomCrop(2), v.RandomFlip(), v.Normalize(0.5, 0.25), v.Cast('float32'),\n"
        "      v.ResizeAndCrop(8, key='image')]\n"
        "pickle.loads(pickle.dumps(ts))\n"
        "assert 'cv2' not in sys.modules, 'cv2 was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- Decode ------------------------------------------------------------------


def test_decode_png_round_trips_exactly():
    image = random_image(7, 5)
    out = Decode().map(encode(".png", image))
    assert out.dtype == np.uint8 and out.shape == (7, 5, 3)
    np.testing.assert_array_equal(out, image)


def test_decode_returns_rgb_not_bgr():
    red = np.zeros((2, 2, 3), np.uint8)
    red[..., 0] = 255
    out = Decode().map(encode(".png", red))
    assert out[0, 0].tolist() == [255, 0, 0]


def test_decode_grayscale_has_one_channel():
    gray = (np.arange(12, dtype=np.uint8) * 20).reshape(3, 4)
    out = Decode(grayscale=True).map(encode(".png", gray))
    assert out.shape == (3, 4, 1) and out.dtype == np.uint8
    np.testing.assert_array_equal(out[..., 0], gray)


def test_decode_grayscale_png_as_color_repeats_the_channel():
    gray = (np.arange(12, dtype=np.uint8) * 20).reshape(3, 4)
    out = Decode().map(encode(".png", gray))
    assert out.shape == (3, 4, 3)
    for c in range(3):
        np.testing.assert_array_equal(out[..., c], gray)


def test_decode_jpeg_is_close_to_the_original():
    image = np.full((16, 16, 3), (200, 100, 50), np.uint8)
    out = Decode().map(encode(".jpg", image, cv2.IMWRITE_JPEG_QUALITY, 100))
    assert out.shape == (16, 16, 3) and out.dtype == np.uint8
    assert np.abs(out.astype(int) - image).max() <= 3


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview, lambda b: np.frombuffer(b, np.uint8)])
def test_decode_accepts_bytes_like(wrap):
    image = random_image(3, 3)
    np.testing.assert_array_equal(Decode().map(wrap(encode(".png", image))), image)


@pytest.mark.parametrize("data", [b"not an image at all", b"\x89PNG\r\n\x1a\n truncated", b""])
def test_decode_garbage_raises_value_error_with_length_and_head(data):
    with pytest.raises(ValueError) as e:
        Decode().map(data)
    msg = str(e.value)
    assert f"{len(data)} bytes" in msg
    assert repr(data[:8])[2:-1] in msg


def test_decode_wrong_type_raises_type_error():
    with pytest.raises(TypeError, match="str"):
        Decode().map("image.png")


def test_decode_on_dict_key_leaves_other_entries_and_input_alone():
    image = random_image(4, 4)
    record = {"image": encode(".png", image), "label": 3}
    out = Decode(key="image").map(record)
    np.testing.assert_array_equal(out["image"], image)
    assert out["label"] == 3
    assert isinstance(record["image"], bytes)  # the source's record is not modified


# --- Resize ------------------------------------------------------------------


def test_resize_to_exact_height_width():
    out = Resize((3, 5)).map(random_image(10, 8))
    assert out.shape == (3, 5, 3) and out.dtype == np.uint8


def test_resize_int_size_is_square():
    assert Resize(6).map(random_image(10, 8)).shape == (6, 6, 3)


@pytest.mark.parametrize(
    "shape,size,expected",
    [((10, 20), 5, (5, 10)), ((20, 10), 5, (10, 5)), ((30, 40), 15, (15, 20)), ((3, 5), 2, (2, 3)), ((7, 7), 3, (3, 3))],
)
def test_resize_keep_aspect_sets_the_shorter_side(shape, size, expected):
    out = Resize(size, keep_aspect=True).map(random_image(*shape))
    assert out.shape == (*expected, 3)


def test_resize_nearest_upscale_repeats_pixels():
    image = np.array([[[1], [2]], [[3], [4]]], np.uint8)
    out = Resize((4, 4), interpolation="nearest").map(image)
    assert out.shape == (4, 4, 1)  # the channel axis of size 1 is kept
    np.testing.assert_array_equal(out[..., 0], np.repeat(np.repeat([[1, 2], [3, 4]], 2, 0), 2, 1))


def test_resize_constant_image_stays_constant():
    image = np.full((9, 13, 3), 77, np.uint8)
    out = Resize((4, 6), interpolation="area").map(image)
    assert (out == 77).all()


def test_resize_accepts_cv2_constant_and_matches_cv2():
    image = random_image(12, 9)
    out = Resize((5, 7), interpolation=cv2.INTER_CUBIC).map(image)
    np.testing.assert_array_equal(out, cv2.resize(image, (7, 5), interpolation=cv2.INTER_CUBIC))


def test_resize_2d_image_stays_2d():
    assert Resize((2, 3)).map(np.zeros((4, 6), np.uint8)).shape == (2, 3)


def test_resize_handles_negative_strides():
    image = random_image(6, 6)
    np.testing.assert_array_equal(Resize((3, 3)).map(image[:, ::-1]), Resize((3, 3)).map(image.copy()[:, ::-1].copy()))


@pytest.mark.parametrize("size", [0, -3, (0, 4), (4,), (1, 2, 3), 2.5, "64", None, True, (True, 3)])
def test_resize_bad_size_raises_value_error_naming_it(size):
    with pytest.raises(ValueError, match="size"):
        Resize(size)


def test_resize_keep_aspect_needs_an_int():
    with pytest.raises(ValueError, match=r"\(4, 5\)"):
        Resize((4, 5), keep_aspect=True)


def test_resize_bad_interpolation_raises_value_error():
    with pytest.raises(ValueError, match="'bogus'"):
        Resize(4, interpolation="bogus")


def test_resize_unsupported_dtype_raises_value_error_naming_dtype():
    with pytest.raises(ValueError, match="bool"):
        Resize((2, 2)).map(np.zeros((4, 4, 3), bool))


# --- CenterCrop / RandomCrop -------------------------------------------------


def test_center_crop_of_arange_image():
    image = np.arange(36).reshape(6, 6, 1)
    out = CenterCrop(2).map(image)
    np.testing.assert_array_equal(out[..., 0], [[14, 15], [20, 21]])


def test_center_crop_rectangular_with_odd_slack():
    image = np.arange(5 * 6).reshape(5, 6)
    # slack 3 rows -> top 1; slack 2 cols -> left 2
    np.testing.assert_array_equal(CenterCrop((2, 4)).map(image), image[1:3, 1:5])
    np.testing.assert_array_equal(CenterCrop((2, 3)).map(image), image[1:3, 1:4])


def test_center_crop_of_full_size_is_identity():
    image = random_image(4, 5)
    np.testing.assert_array_equal(CenterCrop((4, 5)).map(image), image)


@pytest.mark.parametrize("op", [CenterCrop((5, 2)), RandomCrop((2, 9))])
def test_crop_larger_than_image_raises_value_error_naming_sizes(op):
    image = np.zeros((4, 8, 3), np.uint8)
    with pytest.raises(ValueError) as e:
        op.random_map(image, rng_for(0)) if isinstance(op, RandomCrop) else op.map(image)
    assert "(4, 8, 3)" in str(e.value)
    assert str(op._hw[0]) in str(e.value) and str(op._hw[1]) in str(e.value)


@pytest.mark.parametrize("cls", [CenterCrop, RandomCrop])
@pytest.mark.parametrize("size", [0, (3, -1), "3", 1.0, None])
def test_crop_bad_size_raises_value_error(cls, size):
    with pytest.raises(ValueError, match="size"):
        cls(size)


def test_random_crop_is_a_window_of_the_input():
    image = np.arange(120).reshape(10, 12)
    for k in range(50):
        out = RandomCrop((3, 4)).random_map(image, rng_for(k))
        assert out.shape == (3, 4)
        top, left = divmod(int(out[0, 0]), 12)
        np.testing.assert_array_equal(out, image[top : top + 3, left : left + 4])


def test_random_crop_covers_every_offset():
    image = np.arange(16).reshape(4, 4)
    corners = {int(RandomCrop(3).random_map(image, rng_for(k))[0, 0]) for k in range(200)}
    assert corners == {0, 1, 4, 5}


def test_random_crop_of_full_size_is_identity():
    image = random_image(4, 5)
    np.testing.assert_array_equal(RandomCrop((4, 5)).random_map(image, rng_for(3)), image)


# --- RandomFlip --------------------------------------------------------------


def test_flip_p1_equals_np_flip():
    image = random_image(5, 7)
    np.testing.assert_array_equal(RandomFlip(p=1.0).random_map(image, rng_for(0)), np.flip(image, axis=1))
    np.testing.assert_array_equal(
        RandomFlip(horizontal=False, vertical=True, p=1.0).random_map(image, rng_for(0)), np.flip(image, axis=0)
    )
    np.testing.assert_array_equal(
        RandomFlip(horizontal=True, vertical=True, p=1.0).random_map(image, rng_for(0)), np.flip(image, axis=(0, 1))
    )


def test_flip_p0_is_identity():
    image = random_image(5, 7)
    for k in range(20):
        np.testing.assert_array_equal(RandomFlip(vertical=True, p=0.0).random_map(image, rng_for(k)), image)


def test_flip_output_is_contiguous():
    out = RandomFlip(p=1.0).random_map(random_image(3, 4), rng_for(0))
    assert out.flags.c_contiguous


def test_flip_half_the_time_at_p_half_over_200_keys():
    image = random_image(4, 6)
    flipped = np.flip(image, axis=1)
    n_flipped = 0
    for k in range(200):
        out = RandomFlip(p=0.5).random_map(image, rng_for(k))
        if np.array_equal(out, flipped):
            n_flipped += 1
        else:
            np.testing.assert_array_equal(out, image)
    assert 0 < n_flipped < 200
    assert 60 <= n_flipped <= 140  # binomial(200, .5): 7 standard deviations either side


@pytest.mark.parametrize("kwargs", [dict(p=-0.1), dict(p=1.5), dict(p="0.5"), dict(p=True), dict(horizontal=False, vertical=False)])
def test_flip_bad_arguments_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        RandomFlip(**kwargs)


# --- randomness contract -----------------------------------------------------

RANDOM_OPS = [
    pytest.param(RandomCrop((4, 5)), id="crop"),
    pytest.param(RandomFlip(horizontal=True, vertical=True), id="flip"),
]


@pytest.mark.parametrize("op", RANDOM_OPS)
def test_random_same_key_same_output(op):
    image = random_image(16, 16)
    for k in (0, 1, 12345, 2**63):
        np.testing.assert_array_equal(op.random_map(image, rng_for(k)), op.random_map(image, rng_for(k)))


@pytest.mark.parametrize("op", RANDOM_OPS)
def test_random_different_keys_give_different_outputs(op):
    image = random_image(16, 16)
    outs = {op.random_map(image, rng_for(k)).tobytes() for k in range(100)}
    # flip (both axes) has 4 outcomes, all seen in 100 keys; crop has 13 * 12 = 156
    # positions, so 100 keys land on well over 40 distinct ones.
    assert len(outs) == 4 if isinstance(op, RandomFlip) else len(outs) >= 40


@pytest.mark.parametrize("op", RANDOM_OPS)
def test_random_output_depends_only_on_the_rng_passed(op):
    image = random_image(16, 16)
    expected = [op.random_map(image, rng_for(k)) for k in range(20)]
    np_state, py_state = np.random.get_state(), random.getstate()
    for seed in (0, 1):
        np.random.seed(seed)
        random.seed(seed)
        got = [op.random_map(image, rng_for(k)) for k in range(20)]
        for a, b in zip(expected, got):
            np.testing.assert_array_equal(a, b)
    # and the transforms leave the global generators alone
    np.random.seed(7)
    random.seed(7)
    before = (np.random.get_state()[1].copy(), random.getstate())
    op.random_map(image, rng_for(0))
    assert np.array_equal(np.random.get_state()[1], before[0]) and random.getstate() == before[1]
    np.random.set_state(np_state)
    random.setstate(py_state)


@pytest.mark.parametrize("op", RANDOM_OPS)
def test_random_on_dict_matches_bare_image(op):
    image = random_image(16, 16)
    out = op.__class__(**{**_config(op), "key": "image"}).random_map({"image": image, "label": 1}, rng_for(5))
    np.testing.assert_array_equal(out["image"], op.random_map(image, rng_for(5)))
    assert out["label"] == 1


def _config(op):
    return {f: getattr(op, f) for f in op._fields}


# --- Normalize / Cast --------------------------------------------------------


def test_normalize_per_channel_values():
    image = np.array([[[10, 20, 30], [0, 255, 128]]], np.uint8)
    out = Normalize(mean=[10, 20, 30], std=[2, 4, 0.5]).map(image)
    assert out.dtype == np.float32 and out.shape == (1, 2, 3)
    np.testing.assert_allclose(out, [[[0, 0, 0], [-5, 58.75, 196]]])


def test_normalize_scalar_and_dtype():
    image = np.array([[0, 255]], np.uint8)
    out = Normalize(127.5, 127.5, dtype=np.float64).map(image)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [[-1.0, 1.0]])


def test_normalize_imagenet_matches_numpy():
    mean, std = (0.485 * 255, 0.456 * 255, 0.406 * 255), (0.229 * 255, 0.224 * 255, 0.225 * 255)
    image = random_image(4, 4)
    np.testing.assert_allclose(
        Normalize(mean, std).map(image), (image.astype(np.float32) - np.float32(mean)) / np.float32(std), rtol=1e-6
    )


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(mean=0, std=0), "std"),
        (dict(mean=0, std=[1, 0, 1]), "std"),
        (dict(mean=[1, 2], std=[1, 2, 3]), "mean"),
        (dict(mean=0, std=1, dtype=np.uint8), "dtype"),
        (dict(mean="a", std=1), "mean"),
        (dict(mean=[], std=1), "mean"),
    ],
)
def test_normalize_bad_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Normalize(**kwargs)


def test_normalize_channel_mismatch_raises_value_error():
    with pytest.raises(ValueError, match=r"\(2, 2, 1\)"):
        Normalize([0, 0, 0], [1, 1, 1]).map(np.zeros((2, 2, 1), np.uint8))


def test_cast_values_and_dtype():
    image = np.array([[1, 2, 255]], np.uint8)
    out = Cast(np.float32).map(image)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[1.0, 2.0, 255.0]])
    assert Cast("int16").map(image).dtype == np.int16


def test_cast_bad_dtype_raises_value_error():
    with pytest.raises(ValueError, match="dtype"):
        Cast("not-a-dtype")


# --- ResizeAndCrop -----------------------------------------------------------


@pytest.mark.parametrize("shape", [(30, 40), (40, 30), (64, 64), (10, 100), (5, 7)])
def test_resize_and_crop_gives_a_square(shape):
    out = ResizeAndCrop(16).map(random_image(*shape))
    assert out.shape == (16, 16, 3) and out.dtype == np.uint8


def test_resize_and_crop_equals_resize_then_center_crop():
    image = random_image(30, 50)
    expected = CenterCrop(20).map(Resize(20, keep_aspect=True, interpolation="area").map(image))
    np.testing.assert_array_equal(ResizeAndCrop(20, interpolation="area").map(image), expected)


def test_resize_and_crop_keeps_the_center():
    # Left third 0, middle third 100, right third 200: the centre square is all 100.
    image = np.repeat(np.array([0, 100, 200], np.uint8), 10)[None, :, None].repeat(10, axis=0)
    out = ResizeAndCrop(10, interpolation="nearest").map(image)
    assert (out == 100).all()


@pytest.mark.parametrize("size", [(4, 4), 0, -1, 2.0])
def test_resize_and_crop_bad_size_raises_value_error(size):
    with pytest.raises(ValueError, match="size"):
        ResizeAndCrop(size)


# --- key handling, bad inputs ------------------------------------------------

ALL_OPS = [
    Decode(),
    Resize((4, 4)),
    CenterCrop(2),
    RandomCrop(2),
    RandomFlip(),
    Normalize(0, 1),
    Cast(np.float32),
    ResizeAndCrop(4),
]


def _apply(op, element, key=0):
    if isinstance(op, grain.RandomMapTransform):
        return op.random_map(element, rng_for(key))
    return op.map(element)


@pytest.mark.parametrize("op", [op for op in ALL_OPS if not isinstance(op, Decode)], ids=repr)
def test_dict_record_missing_key_raises_key_error_naming_keys(op):
    op = op.__class__(**{**_config(op), "key": "image"})
    with pytest.raises(KeyError, match="'label'"):
        _apply(op, {"label": 1})


@pytest.mark.parametrize("op", ALL_OPS, ids=repr)
def test_key_on_non_dict_raises_type_error(op):
    op = op.__class__(**{**_config(op), "key": "image"})
    with pytest.raises(TypeError, match="dict"):
        _apply(op, np.zeros((8, 8, 3), np.uint8))


@pytest.mark.parametrize("op", [op for op in ALL_OPS if not isinstance(op, (Decode, Cast))], ids=repr)
def test_non_image_input_raises(op):
    with pytest.raises(TypeError, match="list"):
        _apply(op, [[1, 2], [3, 4]])
    with pytest.raises(ValueError, match=r"\(8,\)"):
        _apply(op, np.zeros(8, np.uint8))


# --- pickling ----------------------------------------------------------------


@pytest.mark.parametrize("dumps,loads", [(pickle.dumps, pickle.loads), (cloudpickle.dumps, pickle.loads)], ids=["pickle", "cloudpickle"])
@pytest.mark.parametrize("op", ALL_OPS + [Resize(5, keep_aspect=True, interpolation="area", key="image")], ids=repr)
def test_pickle_round_trip_keeps_config_and_behaviour(op, dumps, loads):
    copy = loads(dumps(op))
    assert type(copy) is type(op) and repr(copy) == repr(op) and copy == op
    image = random_image(8, 8)
    element = encode(".png", image) if isinstance(op, Decode) else image
    if op.key is not None:
        element = {op.key: element}
        np.testing.assert_array_equal(_apply(copy, element, 3)[op.key], _apply(op, element, 3)[op.key])
    else:
        np.testing.assert_array_equal(_apply(copy, element, 3), _apply(op, element, 3))


def test_repr_shows_config():
    assert repr(Resize(64, keep_aspect=True, key="image")) == "Resize(size=64, keep_aspect=True, interpolation='linear', key='image')"
    assert repr(RandomFlip()) == "RandomFlip(horizontal=True, vertical=False, p=0.5)"


# --- in a DataLoader ---------------------------------------------------------


def _docs_pipeline_batches(worker_count):
    images = [random_image(20 + i % 5, 30 - i % 7, seed=i) for i in range(12)]
    records = [{"image": encode(".png", im), "label": i} for i, im in enumerate(images)]
    loader = grain.DataLoader(
        data_source=records,
        sampler=grain.IndexSampler(len(records), shard_options=grain.NoSharding(), shuffle=True, num_epochs=1, seed=3),
        operations=[
            Decode(key="image"),
            ResizeAndCrop(16, key="image"),
            RandomFlip(key="image"),
            Normalize(127.5, 127.5, key="image"),
            grain.Batch(4),
        ],
        worker_count=worker_count,
    )
    return list(loader)


def test_in_a_data_loader_batches_dict_records():
    batches = _docs_pipeline_batches(0)
    assert len(batches) == 3
    for b in batches:
        assert b["image"].shape == (4, 16, 16, 3) and b["image"].dtype == np.float32
        assert b["label"].shape == (4,)
    assert sorted(np.concatenate([b["label"] for b in batches]).tolist()) == list(range(12))


def _by_label(batches):
    return {
        int(label): image
        for b in batches
        for label, image in zip(b["label"], b["image"])
    }


@pytest.mark.timeout(120)
def test_in_a_data_loader_each_record_does_not_depend_on_worker_count():
    # Each worker batches its own records (as in grain), so batches differ in
    # composition; every record's image, flips included, must not.
    from tests.helpers.leaks import LeakCheck

    leaks = LeakCheck()
    expected = _by_label(_docs_pipeline_batches(0))
    got = _by_label(_docs_pipeline_batches(2))
    leaks.assert_clean()
    assert sorted(got) == sorted(expected) == list(range(12))
    for label, image in expected.items():
        np.testing.assert_array_equal(got[label], image)


# --- docs --------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_docs_examples_run():
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "vision.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:  # later blocks use names from earlier ones, as a reader would
        exec(compile(block, "docs/vision.md", "exec"), namespace)
