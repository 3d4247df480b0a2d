"""Image transforms for DataLoader pipelines, built on OpenCV.

Each transform works on a bare image or, given ``key``, on one entry of a dict
record (the rest of the record passes through untouched):

    >>> import numpy as np
    >>> CenterCrop(2).map(np.zeros((4, 6, 3), np.uint8)).shape
    (2, 2, 3)
    >>> CenterCrop(2, key="image").map({"image": np.zeros((4, 6, 3), np.uint8), "label": 7})["label"]
    7

Images are HWC ``numpy`` arrays (HW is accepted for one channel); ``Decode`` turns
JPEG / PNG bytes into HWC uint8 RGB. The random transforms draw only from the
record's own generator, so their output depends on the seed and the record's
index alone, not on worker count, timing or a restore.

``cv2`` is imported inside the calls that need it: importing this module, and
building or pickling its transforms, costs numpy and the standard library only.
"""

from __future__ import annotations

import copy
import numbers
from collections.abc import Hashable, MutableMapping, Sequence
from typing import Any, Callable, Optional, Union

import numpy as np

from grainlike.core.errors import check_int, is_int
from grainlike.core.transforms import MapTransform, RandomMapTransform

__all__ = [
    "CenterCrop",
    "Cast",
    "Decode",
    "Normalize",
    "RandomCrop",
    "RandomFlip",
    "Resize",
    "ResizeAndCrop",
]

Size = Union[int, Sequence[int]]

# Interpolation names and the values of OpenCV's INTER_* constants, stable across
# OpenCV 4 and 5 (code that passes ``cv2.INTER_AREA`` keeps working). Transforms
# store names, so building and pickling one never needs cv2.
_INTERPOLATION_CODES = {0: "nearest", 1: "linear", 2: "cubic", 3: "area", 4: "lanczos4", 5: "linear_exact", 6: "nearest_exact"}
# Name -> the INTER_* constant's name in lower case.
_INTERPOLATIONS = {n: n for n in _INTERPOLATION_CODES.values()}
_INTERPOLATIONS.update(bilinear="linear", bicubic="cubic", lanczos="lanczos4")


def _parse_size(size: Any, name: str = "size") -> tuple[int, int]:
    """``int`` or ``(height, width)`` of positive ints -> ``(height, width)``."""
    is_pair = isinstance(size, (Sequence, np.ndarray)) and not isinstance(size, (str, bytes)) and len(size) == 2
    pair = (size, size) if is_int(size) else tuple(size) if is_pair and all(is_int(s) for s in size) else (0, 0)
    if pair[0] <= 0 or pair[1] <= 0:
        raise ValueError(f"{name} must be a positive int or a (height, width) pair of positive ints, got {size!r}")
    return int(pair[0]), int(pair[1])


def _parse_interpolation(interpolation: Union[str, int]) -> str:
    if isinstance(interpolation, str) and interpolation.lower() in _INTERPOLATIONS:
        return interpolation.lower()
    if is_int(interpolation) and int(interpolation) in _INTERPOLATION_CODES:
        return _INTERPOLATION_CODES[int(interpolation)]
    raise ValueError(
        f"interpolation must be one of {sorted(_INTERPOLATIONS)} or a cv2.INTER_* constant, got {interpolation!r}"
    )


def _check_image(image: Any, op: str) -> np.ndarray:
    if not isinstance(image, np.ndarray):
        raise TypeError(f"{op} expects an image as a numpy array (HWC or HW), got {type(image).__name__}")
    if image.ndim not in (2, 3):
        raise ValueError(f"{op} expects an HWC or HW image, got an array of shape {image.shape}")
    return image


class _ImageTransform:
    """The ``key`` lookup, and a repr of ``_fields`` (the constructor arguments: the whole configuration)."""

    _fields: tuple[str, ...] = ()
    key: Optional[Hashable]

    def _set_size(self, size: Size) -> None:
        self._hw = _parse_size(size)
        self.size = int(size) if is_int(size) else self._hw

    def _on(self, element: Any, fn: Callable[[Any], Any]) -> Any:
        key = self.key
        if key is None:
            return fn(element)
        if not isinstance(element, MutableMapping):
            raise TypeError(f"{type(self).__name__}(key={key!r}) expects a dict record, got {type(element).__name__}")
        try:
            value = element[key]
        except KeyError:
            raise KeyError(f"{type(self).__name__}: the record has no key {key!r}; its keys are {list(element)}") from None
        # A shallow copy, not an in-place update: a source may hand out the same
        # dict object for every read of a record (e.g. an in-memory list), and
        # writing into it would change what later epochs read.
        out = element.copy() if type(element) is dict else copy.copy(element)
        out[key] = fn(value)
        return out

    def __repr__(self) -> str:
        args = [f"{f}={getattr(self, f)!r}" for f in self._fields]
        if self.key is not None:
            args.append(f"key={self.key!r}")
        return f"{type(self).__name__}({', '.join(args)})"

    def __eq__(self, other: Any) -> bool:
        return type(self) is type(other) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))


class _ImageMap(_ImageTransform, MapTransform):
    """A map transform: ``_apply`` to the image (or to ``element[key]``)."""

    _apply: Callable[[Any], Any]

    def map(self, element: Any) -> Any:
        return self._on(element, self._apply)


class Decode(_ImageMap):
    """Decodes JPEG / PNG (or any format OpenCV reads) bytes to an HWC uint8 RGB image.

    Colour images come out as ``(H, W, 3)`` RGB (not OpenCV's BGR); with
    ``grayscale=True`` as ``(H, W, 1)``. Alpha is dropped, 16-bit PNGs are scaled to
    8 bits, and a JPEG's EXIF orientation is applied (OpenCV's defaults).

    Args:
      grayscale: decode to one channel instead of RGB.
      key: if given, decode ``element[key]`` of a dict record instead of the element.

    Raises:
      TypeError: the input is not bytes-like.
      ValueError: the bytes are not an image OpenCV can decode; the message gives
        their length and first bytes.

    Example:
      >>> import cv2, numpy as np
      >>> png = cv2.imencode(".png", np.zeros((2, 3, 3), np.uint8))[1].tobytes()
      >>> Decode().map(png).shape
      (2, 3, 3)
    """

    _fields = ("grayscale",)

    def __init__(self, grayscale: bool = False, *, key: Optional[Hashable] = None):
        self.grayscale = bool(grayscale)
        self.key = key

    def _apply(self, data: Any) -> np.ndarray:
        if isinstance(data, np.ndarray):
            if data.dtype != np.uint8 or data.ndim != 1:
                raise TypeError(f"Decode expects encoded bytes or a 1-D uint8 array, got an array of shape {data.shape} and dtype {data.dtype}")
            buf = data
        elif isinstance(data, (bytes, bytearray, memoryview)):
            buf = np.frombuffer(data, dtype=np.uint8)
        else:
            raise TypeError(f"Decode expects encoded image bytes, got {type(data).__name__}")
        if buf.size == 0:
            raise ValueError("Decode could not decode an image: got 0 bytes")
        import cv2

        if self.grayscale:
            image = cv2.imdecode(buf, cv2.IMREAD_GRAYSCALE)
        else:
            rgb_flag = getattr(cv2, "IMREAD_COLOR_RGB", None)  # OpenCV >= 4.10
            image = cv2.imdecode(buf, cv2.IMREAD_COLOR if rgb_flag is None else rgb_flag)
            if image is not None and rgb_flag is None:
                image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
        if image is None:
            head = bytes(buf[:16])
            raise ValueError(
                f"Decode could not decode an image from {buf.size} bytes starting {head!r}; "
                "expected JPEG, PNG or another format OpenCV reads"
            )
        return image[:, :, None] if image.ndim == 2 else image


class Resize(_ImageMap):
    """Resizes an image to an exact size, or its shorter side to ``size`` keeping aspect.

    Args:
      size: ``(height, width)`` or an int for a square; with ``keep_aspect=True``, an
        int: the length of the shorter side after resizing (the longer side is
        scaled by the same factor and rounded to the nearest pixel).
      keep_aspect: keep the aspect ratio, resizing the shorter side to ``size``.
      interpolation: ``"nearest"``, ``"linear"`` (``"bilinear"``), ``"cubic"``,
        ``"area"``, ``"lanczos4"``, ... or a ``cv2.INTER_*`` constant. ``"area"``
        gives the least aliasing when shrinking.
      key: if given, resize ``element[key]`` of a dict record.

    Raises:
      ValueError: a bad ``size`` / ``interpolation``, or an image OpenCV cannot resize.

    Example:
      >>> import numpy as np
      >>> Resize((2, 4)).map(np.zeros((10, 10, 3), np.uint8)).shape
      (2, 4, 3)
      >>> Resize(5, keep_aspect=True).map(np.zeros((10, 20, 3), np.uint8)).shape
      (5, 10, 3)
    """

    _fields = ("size", "keep_aspect", "interpolation")

    def __init__(self, size: Size, keep_aspect: bool = False, interpolation: Union[str, int] = "linear", *, key: Optional[Hashable] = None):
        if keep_aspect and not (is_int(size) and size > 0):
            raise ValueError(f"with keep_aspect=True, size must be a positive int (the shorter side), got {size!r}")
        self._set_size(size)
        self.keep_aspect = bool(keep_aspect)
        self.interpolation = _parse_interpolation(interpolation)
        self.key = key

    def _target(self, h: int, w: int) -> tuple[int, int]:
        if not self.keep_aspect:
            return self._hw
        s = self.size
        if h <= w:
            return s, max(1, int(w * s / h + 0.5))
        return max(1, int(h * s / w + 0.5)), s

    def _apply(self, image: Any) -> np.ndarray:
        image = _check_image(image, "Resize")
        h, w = image.shape[:2]
        if h == 0 or w == 0:
            raise ValueError(f"Resize got an empty image of shape {image.shape}")
        th, tw = self._target(h, w)
        if (th, tw) == (h, w):
            return image
        import cv2

        try:
            # cv2 wants positive strides (e.g. not the output of np.flip).
            out = cv2.resize(np.ascontiguousarray(image), (tw, th), interpolation=getattr(cv2, "INTER_" + _INTERPOLATIONS[self.interpolation].upper()))
        except cv2.error as e:
            raise ValueError(
                f"Resize could not resize an image of shape {image.shape} and dtype {image.dtype} to "
                f"(height, width) = ({th}, {tw}) with {self.interpolation!r}: {e}"
            ) from e
        # cv2 drops a trailing channel axis of size 1; keep the input's layout.
        return out[:, :, None] if image.ndim == 3 and out.ndim == 2 else out


class _Crop(_ImageTransform):
    """Shared by the crops: their ``size`` and the cut itself."""

    _fields = ("size",)

    def __init__(self, size: Size, *, key: Optional[Hashable] = None):
        self._set_size(size)
        self.key = key

    def _cut(self, image: Any, place: Callable[[int], int]) -> np.ndarray:
        """Crops ``size`` at offset ``place(slack)`` of the height, then of the width."""
        op = type(self).__name__
        image = _check_image(image, op)
        (th, tw), (h, w) = self._hw, image.shape[:2]
        if th > h or tw > w:
            raise ValueError(
                f"{op} of size (height, width) = ({th}, {tw}) does not fit in an image of shape "
                f"{image.shape}; resize first (e.g. ResizeAndCrop) or crop smaller"
            )
        top = place(h - th)
        left = place(w - tw)
        # A view: Batch copies each record into the batch anyway, so copying here
        # would only double the work.
        return image[top : top + th, left : left + tw]


class CenterCrop(_Crop, _ImageMap):
    """Crops the centre ``size`` of an image (when the slack is odd, the extra pixel is cut from the bottom / right).

    Args:
      size: ``(height, width)`` or an int for a square.
      key: if given, crop ``element[key]`` of a dict record.

    Raises:
      ValueError: a bad ``size``, or a crop larger than the image.

    Example:
      >>> import numpy as np
      >>> CenterCrop(2).map(np.arange(16).reshape(4, 4)).tolist()
      [[5, 6], [9, 10]]
    """

    def _apply(self, image: Any) -> np.ndarray:
        return self._cut(image, lambda slack: slack // 2)


class RandomCrop(_Crop, RandomMapTransform):
    """Crops ``size`` at a uniformly random position drawn from the record's rng.

    Args:
      size: ``(height, width)`` or an int for a square.
      key: if given, crop ``element[key]`` of a dict record.

    Raises:
      ValueError: a bad ``size``, or a crop larger than the image.

    Example:
      >>> import numpy as np
      >>> rng = np.random.Generator(np.random.Philox(key=0))
      >>> RandomCrop((2, 3)).random_map(np.zeros((8, 8, 3), np.uint8), rng).shape
      (2, 3, 3)
    """

    def random_map(self, element: Any, rng: np.random.Generator) -> Any:
        return self._on(element, lambda image: self._cut(image, lambda slack: int(rng.integers(0, slack + 1))))


class RandomFlip(_ImageTransform, RandomMapTransform):
    """Flips an image left-right and/or up-down, each with probability ``p``.

    The two flips are decided independently, each by one draw from the record's rng.

    Args:
      horizontal: maybe flip left-right (along the width axis).
      vertical: maybe flip up-down (along the height axis).
      p: probability of each enabled flip, in [0, 1].
      key: if given, flip ``element[key]`` of a dict record.

    Raises:
      ValueError: ``p`` outside [0, 1], or neither direction enabled.

    Example:
      >>> import numpy as np
      >>> rng = np.random.Generator(np.random.Philox(key=0))
      >>> RandomFlip(p=1.0).random_map(np.array([[1, 2, 3]]), rng).tolist()
      [[3, 2, 1]]
    """

    _fields = ("horizontal", "vertical", "p")

    def __init__(self, horizontal: bool = True, vertical: bool = False, p: float = 0.5, *, key: Optional[Hashable] = None):
        if not horizontal and not vertical:
            raise ValueError("RandomFlip needs horizontal=True or vertical=True, got both False")
        if isinstance(p, bool) or not isinstance(p, (numbers.Real, np.floating, np.integer)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be a probability in [0, 1], got {p!r}")
        self.horizontal = bool(horizontal)
        self.vertical = bool(vertical)
        self.p = float(p)
        self.key = key

    def random_map(self, element: Any, rng: np.random.Generator) -> Any:
        return self._on(element, lambda image: self._random_flip(image, rng))

    def _random_flip(self, image: Any, rng: np.random.Generator) -> np.ndarray:
        image = _check_image(image, "RandomFlip")
        if self.horizontal and rng.random() < self.p:
            image = image[:, ::-1]
        if self.vertical and rng.random() < self.p:
            image = image[::-1]
        # Negative strides would trip later consumers (torch.from_numpy, some cv2
        # calls); a copy of one image is cheap next to decoding it.
        return np.ascontiguousarray(image)


class Normalize(_ImageMap):
    """Computes ``(image - mean) / std`` in a floating ``dtype``.

    Args:
      mean: a scalar, or one value per channel.
      std: a scalar, or one value per channel; every value non-zero.
      dtype: a floating output dtype.
      key: if given, normalize ``element[key]`` of a dict record.

    Raises:
      ValueError: a zero std, a non-floating dtype, or per-channel values that do
        not match the image's channel count.

    Example:
      >>> import numpy as np
      >>> Normalize(mean=[0, 10], std=[1, 2]).map(np.array([[[4, 14]]], np.uint8)).tolist()
      [[[4.0, 2.0]]]
    """

    _fields = ("mean", "std", "dtype")

    def __init__(self, mean: Union[float, Sequence[float]], std: Union[float, Sequence[float]], dtype: Any = np.float32, *, key: Optional[Hashable] = None):
        try:
            dt = np.dtype(dtype)
        except TypeError as e:
            raise ValueError(f"dtype must be a floating numpy dtype, got {dtype!r}") from e
        if not np.issubdtype(dt, np.floating):
            raise ValueError(f"dtype must be a floating numpy dtype (e.g. np.float32), got {dtype!r}")
        self._mean = self._values(mean, "mean", dt)
        self._std = self._values(std, "std", dt)
        if self._mean.ndim and self._std.ndim and self._mean.size != self._std.size:
            raise ValueError(f"mean and std must have the same number of channels, got mean={mean!r} and std={std!r}")
        if np.any(self._std == 0):
            raise ValueError(f"std must be non-zero, got {std!r}")
        # Plain floats / tuples keep repr and pickles independent of numpy types.
        self.mean = float(self._mean) if self._mean.ndim == 0 else tuple(float(m) for m in self._mean)
        self.std = float(self._std) if self._std.ndim == 0 else tuple(float(s) for s in self._std)
        self.dtype = dt
        self.key = key

    @staticmethod
    def _values(v: Any, name: str, dt: np.dtype) -> np.ndarray:
        try:
            arr = np.asarray(v, dtype=dt)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{name} must be a number or a sequence of numbers, got {v!r}") from e
        if arr.ndim > 1 or arr.size == 0 or not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be a finite number or a non-empty sequence of finite numbers, got {v!r}")
        return arr

    def _apply(self, image: Any) -> np.ndarray:
        image = _check_image(image, "Normalize")
        n = self._mean.size if self._mean.ndim else self._std.size if self._std.ndim else 1
        if (self._mean.ndim or self._std.ndim) and (image.ndim != 3 or image.shape[2] != n):
            raise ValueError(
                f"Normalize has per-channel mean {self.mean!r} and std {self.std!r}, which do not match an "
                f"image of shape {image.shape}"
            )
        out = np.subtract(image, self._mean, dtype=self.dtype)
        out /= self._std
        return out


class Cast(_ImageMap):
    """Casts an image to ``dtype`` (plain ``astype``: no scaling or clipping).

    Args:
      dtype: any numpy dtype.
      key: if given, cast ``element[key]`` of a dict record.

    Example:
      >>> import numpy as np
      >>> Cast(np.float32).map(np.array([[1, 2]], np.uint8)).dtype
      dtype('float32')
    """

    _fields = ("dtype",)

    def __init__(self, dtype: Any, *, key: Optional[Hashable] = None):
        try:
            self.dtype = np.dtype(dtype)
        except TypeError as e:
            raise ValueError(f"dtype must be a numpy dtype, got {dtype!r}") from e
        self.key = key

    def _apply(self, image: Any) -> np.ndarray:
        return np.asarray(image).astype(self.dtype, copy=False)


class ResizeAndCrop(_ImageMap):
    """Resizes the shorter side to ``size``, then crops the centre ``size`` x ``size`` square.

    The usual preprocessing for square-input image models, as in Grain's DataLoader
    guide: nothing is stretched, and only the longer side loses pixels.

    Args:
      size: side of the output square.
      interpolation: as for :class:`Resize`.
      key: if given, transform ``element[key]`` of a dict record.

    Example:
      >>> import numpy as np
      >>> ResizeAndCrop(4).map(np.zeros((8, 16, 3), np.uint8)).shape
      (4, 4, 3)
    """

    _fields = ("size", "interpolation")

    def __init__(self, size: int, interpolation: Union[str, int] = "linear", *, key: Optional[Hashable] = None):
        self.size = check_int("size (the side of the output square)", size, 1)
        self._resize = Resize(self.size, keep_aspect=True, interpolation=interpolation)
        self._crop = CenterCrop(self.size)
        self.interpolation = self._resize.interpolation
        self.key = key

    def _apply(self, image: Any) -> np.ndarray:
        return self._crop._apply(self._resize._apply(image))
