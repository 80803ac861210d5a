"""Nebulae's ``nebulae.fuel.depot`` (v0.5.15, torch core): ``Tank``, ``Comburant`` and transforms.

The Tank is dualtrain's with Nebulae's defaults: batches are torch tensors, the incomplete
last batch is dropped (``in_same_size=True``), and ``prep_fn`` runs on each sample.
``fetch_fn(data, idx)`` reads images decoded, as the brochure's example reads them
(``data.raw`` holds the encoded bytes Nebulae's HDF5 file gave).

The Comburant is Nebulae's: it takes PIL images, arrays or encoded bytes
(``is_encoded=True``), applies Pillow transforms drawn from Python's `random` (seed it
with ``toolkit.destine``), and returns float32 images in [0, 1], channel-last or, with
``HWC2CHW()`` last, channel-first.
"""

from __future__ import annotations

import io
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.fuel.pack import Pack
from dualtrain.fuel.tank import Tank as _Tank

__all__ = [
    "CUBIC", "HORIZONTAL", "LINEAR", "NEAREST", "VERTICAL",
    "Brighten", "Comburant", "Contrast", "Crop", "Flip", "HWC2CHW", "Hue", "Random", "Resize",
    "Rotate", "Saturate", "Tank",
]  # fmt: skip

NEAREST, LINEAR, CUBIC = 0, 1, 2
HORIZONTAL, VERTICAL = 10, 11
_RESAMPLE = {
    NEAREST: Image.Resampling.NEAREST,
    LINEAR: Image.Resampling.BILINEAR,
    CUBIC: Image.Resampling.BICUBIC,
}


# ---- the Tank ----


def _spec(data_path: Any, data_specf: Any) -> Mapping[str, str]:
    if isinstance(data_specf, Mapping):
        return data_specf  # dtypes checked by the Tank ('vunit8' stays a typo)
    if not isinstance(data_specf, str):
        raise bad_argument("data_specf", data_specf, "a dict key -> dtype, or a column key")
    pack = Pack(data_path)
    try:
        if data_specf not in pack.columns:
            raise bad_argument("data_specf", data_specf, f"a column among {pack.keys}")
        # Nebulae read only this key (to count rows); its fetch_fn reads any column
        return {key: str(meta["type"]) for key, meta in pack.columns.items()}
    finally:
        pack.close()


class Tank(_Tank):
    """dualtrain's Tank with Nebulae's argument order and defaults.

    ``Tank(data_path, data_specf, batch_size, shuffle=True, in_same_size=True,
    fetch_fn=None, prep_fn=None, collate_fn=None)``.

    Args:
        data_specf: a dict key -> dtype (checked against the pack), or one column key as
            Nebulae's demo_dist gives it: every column is then served as stored.
        in_same_size: True drops each epoch's incomplete last batch (Nebulae's DataLoader
            ``drop_last``), so ``MPE = len // batch_size``; False serves it short.
        fetch_fn: ``fetch_fn(data, idx)``: ``data[key][idx]`` is the cell with images
            decoded to ``(H, W, C)`` uint8 (what the brochure's fetcher reads; the
            Comburant takes them with ``is_encoded=True`` too); ``data.raw[key][idx]`` is
            the stored cell, an image's encoded bytes (what Nebulae's HDF5 file gave).
        options: dualtrain's Tank keywords (``seed``, ``workers``, ``to``...); ``to`` is
            "torch" by default.
    """

    def __init__(
        self,
        data_path: Any,
        data_specf: Any,
        batch_size: int,
        shuffle: bool = True,
        in_same_size: bool = True,
        fetch_fn: Callable[[Any, int], Any] | None = None,
        prep_fn: Callable[[Any], Any] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(in_same_size, bool):
            raise bad_argument("in_same_size", in_same_size, "a bool")
        if fetch_fn is not None and not callable(fetch_fn):
            raise bad_argument("fetch_fn", fetch_fn, "None or a function fetch_fn(data, idx)")
        options.setdefault("to", "torch")
        if in_same_size:
            options.setdefault("drop_last", True)
        super().__init__(
            data_path, _spec(data_path, data_specf), batch_size, shuffle, in_same_size,
            fetch_fn, prep_fn, collate_fn,
            **options,
        )  # fmt: skip

    @property
    def MPE(self) -> int:  # noqa: N802 - Nebulae's name: "miles per epoch"
        """Batches per epoch for this rank: ``len // batch_size`` with `in_same_size`."""
        return self.batches_per_epoch


# ---- the Comburant and its transforms ----


def _image(value: Any, is_encoded: bool) -> Image.Image:
    if isinstance(value, Image.Image):
        return value
    if isinstance(value, (bytes, bytearray)) or (
        is_encoded and isinstance(value, np.ndarray) and value.ndim == 1
    ):
        data = bytes(value) if isinstance(value, (bytes, bytearray)) else value.tobytes()
        try:
            image = Image.open(io.BytesIO(data))
            image.load()
        except (OSError, ValueError) as err:
            raise ArgumentError(f"an encoded image could not be decoded: {err}") from err
        return image
    if isinstance(value, np.ndarray) and value.ndim in (2, 3):
        if value.dtype != np.uint8:
            raise bad_argument("image", value.dtype, "uint8 pixels (or a PIL image, or bytes)")
        return Image.fromarray(value[..., 0] if value.ndim == 3 and value.shape[2] == 1 else value)
    raise bad_argument(
        "image",
        type(value).__name__,
        "a PIL image, an (H, W[, C]) uint8 array, or encoded bytes with is_encoded=True",
    )


class _Transform:
    """Takes one image or a sequence of frames; one draw serves every frame of a call."""

    def draw(self, frames: list[Image.Image]) -> Any:
        return None

    def apply(self, image: Image.Image, drawn: Any, index: int) -> Image.Image:
        raise NotImplementedError

    def __call__(self, imgs: Any) -> Any:
        many = isinstance(imgs, (list, tuple))
        frames = [_image(f, False) for f in (imgs if many else [imgs])]
        drawn = self.draw(frames)
        out = [self.apply(f, drawn, i) for i, f in enumerate(frames)]
        return out if many else out[0]


class HWC2CHW:
    """Last in a Comburant: its float images come out channel-first ``(C, H, W)``."""

    def __call__(self, img: np.ndarray) -> np.ndarray:
        if np.ndim(img) != 3:
            raise bad_argument("img", np.shape(img), "an (H, W, C) image")
        return np.transpose(img, (2, 0, 1))


class Comburant:
    """Chains transforms; returns float32 images in [0, 1] (Nebulae's ``img / 255``).

    Args:
        transforms: Nebulae transforms (or any callable on PIL images), in order;
            ``HWC2CHW()`` last makes the output channel-first.
        is_encoded: inputs are encoded bytes (a pack's image cells): decode them first.
    """

    def __init__(self, *transforms: Callable[[Any], Any], is_encoded: bool = False) -> None:
        if not isinstance(is_encoded, bool):
            raise bad_argument("is_encoded", is_encoded, "a bool")
        chain = list(transforms)
        self.to_chw = chain.pop() if chain and isinstance(chain[-1], HWC2CHW) else None
        for i, t in enumerate(chain):
            if isinstance(t, HWC2CHW):
                raise ArgumentError(f"transforms[{i}]: HWC2CHW() goes last, after every transform")
            if not callable(t):
                raise bad_argument(f"transforms[{i}]", t, "a transform (a callable on images)")
        self.transforms, self.is_encoded = chain, is_encoded

    def __call__(self, imgs: Any) -> Any:
        many = isinstance(imgs, (list, tuple))
        frames: Any = [_image(f, self.is_encoded) for f in (imgs if many else [imgs])]
        for t in self.transforms:
            # Nebulae's own transforms take the frames together (one draw for all); any
            # other callable is handed one image at a time, as torchvision's Compose did
            frames = t(frames) if isinstance(t, _Transform) else [t(f) for f in frames]
        out = [np.asarray(f, dtype=np.float32) / 255 for f in frames]
        if self.to_chw is not None:
            out = [self.to_chw(o) for o in out]
        return out if many else out[0]


class Random(_Transform):
    """Applies `comburant` (a transform) with probability `p`, to every frame or none."""

    def __init__(self, p: float, comburant: Callable[[Any], Any]) -> None:
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0 <= p <= 1:
            raise bad_argument("p", p, "a probability in [0, 1]")
        self.p, self.comburant = float(p), comburant

    def __call__(self, imgs: Any) -> Any:
        return self.comburant(imgs) if random.random() < self.p else imgs


def _size(name: str, size: Any) -> tuple[int, int]:
    if (
        not isinstance(size, (tuple, list))
        or len(size) != 2
        or not all(isinstance(s, int) and s > 0 for s in size)
    ):
        raise bad_argument(name, size, "(height, width), two positive ints")
    return int(size[0]), int(size[1])


def _resample(interp: Any) -> Image.Resampling:
    if interp not in _RESAMPLE:
        raise bad_argument("interp", interp, "NEAREST, LINEAR or CUBIC")
    return _RESAMPLE[interp]


class Resize(_Transform):
    """To `size` = (height, width)."""

    def __init__(self, size: Sequence[int], interp: int = LINEAR) -> None:
        self.size, self.resample = _size("size", size), _resample(interp)

    def apply(self, image: Image.Image, drawn: Any, index: int) -> Image.Image:
        return image.resize((self.size[1], self.size[0]), self.resample)


class Crop(_Transform):
    """A random crop of `size` = (height, width), after `padding` (left, top, right, bottom).

    With `area_ratio` / `aspect_ratio` other than (1, 1) it is a random resized crop: a
    region of that share of the area and aspect, resized to `size`. `scale` gives each
    frame of a sequence its own size multiple.
    """

    def __init__(
        self,
        size: Sequence[int],
        padding: Sequence[int] = (0, 0, 0, 0),
        area_ratio: Sequence[float] = (1, 1),
        aspect_ratio: Sequence[float] = (1, 1),
        interp: int = LINEAR,
        scale: Sequence[int] = (),
    ) -> None:
        self.size = _size("size", size)
        if (
            not isinstance(padding, (tuple, list))
            or len(padding) != 4
            or not all(isinstance(p, int) and p >= 0 for p in padding)
        ):
            raise bad_argument("padding", padding, "(left, top, right, bottom), ints >= 0")
        self.padding, self.scale = tuple(padding), tuple(scale)
        for name, pair in (("area_ratio", area_ratio), ("aspect_ratio", aspect_ratio)):
            if (
                not isinstance(pair, (tuple, list))
                or len(pair) != 2
                or not all(isinstance(v, (int, float)) and v > 0 for v in pair)
                or pair[0] > pair[1]
            ):
                raise bad_argument(name, pair, "(low, high), two positive numbers, low <= high")
        self.area, self.aspect = tuple(area_ratio), tuple(aspect_ratio)
        self.resized = not (self.area == self.aspect == (1, 1))
        self.resample = _resample(interp)

    def _padded(self, image: Image.Image, times: int = 1) -> Image.Image:
        image = ImageOps.expand(image, tuple(p * times for p in self.padding), fill=0)
        height, width = self.size[0] * times, self.size[1] * times
        grow_w, grow_h = max(width - image.width, 0), max(height - image.height, 0)
        if grow_w or grow_h:  # too small for the crop: pad both sides alike
            image = ImageOps.expand(image, (grow_w, grow_h, grow_w, grow_h), fill=0)
        return image

    def draw(self, frames: list[Image.Image]) -> tuple[int, int, int, int]:
        image = self._padded(frames[0])
        width, height = image.size
        if not self.resized:
            th, tw = self.size
            return random.randint(0, height - th), random.randint(0, width - tw), th, tw
        area = width * height
        log_ratio = (math.log(self.aspect[0]), math.log(self.aspect[1]))
        for _ in range(10):
            target = area * random.uniform(*self.area)
            ratio = math.exp(random.uniform(*log_ratio))
            w = round(math.sqrt(target * ratio))
            h = round(math.sqrt(target / ratio))
            if 0 < w <= width and 0 < h <= height:
                return random.randint(0, height - h), random.randint(0, width - w), h, w
        side = min(width, height)  # no draw fitted: the central square
        return (height - side) // 2, (width - side) // 2, side, side

    def apply(self, image: Image.Image, drawn: Any, index: int) -> Image.Image:
        times = self.scale[index] if index < len(self.scale) else 1
        top, left, h, w = (v * times for v in drawn)
        region = self._padded(image, times).crop((left, top, left + w, top + h))
        if self.resized:
            return region.resize((self.size[1] * times, self.size[0] * times), self.resample)
        return region


class Flip(_Transform):
    """``Flip(axial)`` always flips (v0.5.15's code); ``Flip(p, axial)`` with probability p.

    VERTICAL mirrors left-right (about the vertical axis), HORIZONTAL top-bottom.
    """

    def __init__(self, *args: Any) -> None:
        if len(args) == 1:
            p, axial = 1.0, args[0]
        elif len(args) == 2:
            p, axial = args
        else:
            raise ArgumentError(f"Flip takes (axial) or (p, axial); got {len(args)} arguments")
        if axial not in (HORIZONTAL, VERTICAL):
            raise bad_argument("axial", axial, "depot.HORIZONTAL or depot.VERTICAL")
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0 <= p <= 1:
            raise bad_argument("p", p, "a probability in [0, 1]")
        self.p = float(p)
        self.method = (
            Image.Transpose.FLIP_LEFT_RIGHT
            if axial == VERTICAL
            else Image.Transpose.FLIP_TOP_BOTTOM
        )

    def draw(self, frames: list[Image.Image]) -> bool:
        return self.p >= 1 or random.random() < self.p

    def apply(self, image: Image.Image, drawn: Any, index: int) -> Image.Image:
        return image.transpose(self.method) if drawn else image


class Rotate(_Transform):
    """By an angle drawn from [-degree, degree]; `intact` enlarges the image to keep it whole."""

    def __init__(self, degree: float, intact: bool = False, interp: int = NEAREST) -> None:
        if not isinstance(degree, (int, float)) or degree < 0:
            raise bad_argument("degree", degree, "a number of degrees >= 0")
        self.degree, self.intact, self.resample = float(degree), bool(intact), _resample(interp)

    def draw(self, frames: list[Image.Image]) -> float:
        return random.uniform(-self.degree, self.degree)

    def apply(self, image: Image.Image, drawn: Any, index: int) -> Image.Image:
        return image.rotate(drawn, self.resample, expand=self.intact)


class _Enhance(_Transform):
    enhancer: Any = None

    def __init__(self, range: float) -> None:
        if not isinstance(range, (int, float)) or range < 0:
            raise bad_argument("range", range, "a number >= 0")
        self.range = float(range)

    def draw(self, frames: list[Image.Image]) -> float:
        return random.uniform(max(0.0, 1 - self.range), 1 + self.range)

    def apply(self, image: Image.Image, drawn: Any, index: int) -> Image.Image:
        return type(self).enhancer(image).enhance(drawn)


class Brighten(_Enhance):
    """Brightness times a factor drawn from [1 - range, 1 + range]."""

    enhancer = ImageEnhance.Brightness


class Contrast(_Enhance):
    """Contrast times a factor drawn from [1 - range, 1 + range]."""

    enhancer = ImageEnhance.Contrast


class Saturate(_Enhance):
    """Saturation times a factor drawn from [1 - range, 1 + range]."""

    enhancer = ImageEnhance.Color


class Hue(_Transform):
    """Hue shifted by a share of the circle drawn from [-range, range] (range <= 0.5)."""

    def __init__(self, range: float) -> None:
        if not isinstance(range, (int, float)) or not 0 <= range <= 0.5:
            raise bad_argument("range", range, "a number in [0, 0.5]")
        self.range = float(range)

    def draw(self, frames: list[Image.Image]) -> float:
        return random.uniform(-self.range, self.range)

    def apply(self, image: Image.Image, drawn: Any, index: int) -> Image.Image:
        if image.mode in ("L", "1", "I", "F"):
            return image
        h, s, v = image.convert("HSV").split()
        shift = np.uint8(round(drawn * 255) % 256)
        hue = Image.fromarray((np.asarray(h, dtype=np.uint8) + shift).astype(np.uint8), "L")
        return Image.merge("HSV", (hue, s, v)).convert(image.mode)
