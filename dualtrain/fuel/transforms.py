"""The seeded transforms a Comburant composes.

Each transform splits into `draw(rng, shape)`, which draws its parameters once, and
`apply(x, params, mask=False)`, which is deterministic, so one draw serves an image and its
mask, or every frame of a sequence. Images are uint8 ``(H, W)`` or ``(H, W, C)``; outputs
keep shape and dtype, and photometric changes saturate at 0 and 255 (no wrap-around).
Geometric transforms resample masks with nearest-neighbour; photometric ones leave masks be.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dualtrain.errors import bad_argument
from dualtrain.fuel.images import MODES

__all__ = ["Brighten", "Contrast", "Crop", "Flip", "Rotate", "Sampling", "Saturate", "Transform"]

_LUMA = np.array([0.299, 0.587, 0.114], np.float32)  # ITU-R 601, as Pillow's "L" mode


class Transform:
    """Base of the transforms: `draw` parameters once, `apply` them to each array."""

    geometric = False  # also moves masks
    sequence_only = False  # acts on the list of frames, not on one image

    def draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> Any:
        raise NotImplementedError

    def apply(self, x: np.ndarray, params: Any, mask: bool = False) -> np.ndarray:
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


def _number(value: Any) -> bool:
    """A finite int or float, not a bool."""
    return (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, (bool, np.bool_))
        and math.isfinite(value)
    )


def _range(
    name: str, value: Any, low: float, around: float | None = None, high: float = math.inf
) -> tuple[float, float]:
    """A (lo, hi) range within [low, high] from a number or a (low, high) pair.

    A number v gives around +- v (or -v..v). Anything else (bools, NaN, inf, reversed or
    out-of-range pairs) is refused here, not at the first sample.
    """
    span = f"[{low:g}, {high:g}]"
    if _number(value):
        lo, hi = (around - value, around + value) if around is not None else (-value, value)
        if value < 0 or hi > high:
            raise bad_argument(
                name, value, f"a non-negative number with a range within {span}, or a pair"
            )
        return max(lo, low), float(hi)
    if (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(_number(v) for v in value)
        and low <= value[0] <= value[1] <= high
    ):
        return float(value[0]), float(value[1])
    raise bad_argument(
        name, value, f"a finite non-negative number or a (low, high) pair within {span}"
    )


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise bad_argument(name, value, "a bool")
    return bool(value)


class Flip(Transform):
    """Mirrors left-right (`horizontal`) and/or up-down (`vertical`), each with chance `p`."""

    geometric = True

    def __init__(self, horizontal: bool = True, vertical: bool = False, p: float = 0.5) -> None:
        if not _number(p) or not 0.0 <= p <= 1.0:
            raise bad_argument("p", p, "a probability in [0, 1]")
        self.horizontal = _flag("horizontal", horizontal)
        self.vertical = _flag("vertical", vertical)
        self.p = float(p)

    def draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[bool, bool]:
        u = rng.random(2)
        return bool(self.horizontal and u[0] < self.p), bool(self.vertical and u[1] < self.p)

    def apply(self, x: np.ndarray, params: tuple[bool, bool], mask: bool = False) -> np.ndarray:
        left_right, up_down = params
        if not (left_right or up_down):
            return x
        # Copy whole pixels, not bytes: a reversed copy of 3-byte pixels as one void item
        # each runs ~3x faster than NumPy's byte-strided copy of (H, W, 3) uint8.
        pixels = x.view(f"V{x.shape[2]}")[..., 0] if x.ndim == 3 and x.flags.c_contiguous else x
        if left_right:
            pixels = pixels[:, ::-1]
        if up_down:
            pixels = pixels[::-1]
        out = np.ascontiguousarray(pixels)
        return out.view(np.uint8).reshape(x.shape) if out.dtype != np.uint8 else out


class Crop(Transform):
    """Crops a random part (`area` share of the image, aspect `ratio`) and resizes it back.

    The draw is torchvision's RandomResizedCrop: ten tries, then the central crop.
    """

    geometric = True

    def __init__(
        self, area: tuple[float, float] = (0.08, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3)
    ) -> None:
        self.area = _range("area", area, 0.0, high=1.0)
        self.ratio = _range("ratio", ratio, 1e-6, high=1e6)
        if not 0 < self.area[1] <= 1:
            raise bad_argument("area", area, "a (low, high) pair within (0, 1]")

    def draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
        height, width = shape[0], shape[1]
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = height * width * rng.uniform(*self.area)
            aspect = math.exp(rng.uniform(*log_ratio))
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                left = int(rng.integers(0, width - w + 1))
                return top, left, h, w
        return 0, 0, height, width

    def apply(
        self, x: np.ndarray, params: tuple[int, int, int, int], mask: bool = False
    ) -> np.ndarray:
        top, left, h, w = params
        size, box = (x.shape[1], x.shape[0]), (left, top, left + w, top + h)
        return _with_pillow(x, lambda im, nearest: im.resize(size, _filter(nearest), box=box), mask)


class Rotate(Transform):
    """Rotates by an angle drawn in [-degrees, degrees] (or a (low, high) pair), filling 0."""

    geometric = True

    def __init__(self, degrees: float | tuple[float, float] = 10.0) -> None:
        self.degrees = _range("degrees", degrees, -360.0, high=360.0)

    def draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> float:
        return float(rng.uniform(*self.degrees))

    def apply(self, x: np.ndarray, params: float, mask: bool = False) -> np.ndarray:
        if params == 0.0:
            return x
        return _with_pillow(x, lambda im, nearest: im.rotate(params, _filter(nearest)), mask)


class Brighten(Transform):
    """Adds a shift drawn in [-delta, delta] (a share of full scale, 255) to every pixel.

    `delta` is in [0, 1] (or a pair within [-1, 1]): a shift of full scale already turns
    any image white or black.
    """

    def __init__(self, delta: float | tuple[float, float] = 0.1) -> None:
        self.delta = _range("delta", delta, -1.0, high=1.0)

    def draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> int:
        return round(rng.uniform(*self.delta) * 255)

    def apply(self, x: np.ndarray, params: int, mask: bool = False) -> np.ndarray:
        if mask or params == 0:
            return x
        shift = np.uint8(abs(params))

        def saturating(c: np.ndarray) -> np.ndarray:
            # Clamp first, then shift: two vector passes, no wrap-around, no int16 copy.
            if params > 0:
                out = np.minimum(c, np.uint8(255) - shift)
                out += shift
            else:
                out = np.maximum(c, shift)
                out -= shift
            return out

        return _colour(x, saturating)


class _Scaling(Transform):
    """A photometric transform drawing one factor in [1-f, 1+f] (>= 0) or a (low, high)."""

    def __init__(self, factor: float | tuple[float, float] = 0.2) -> None:
        # 255 as a factor already maps any non-flat image to 0 and 255.
        self.factor = _range("factor", factor, 0.0, around=1.0, high=256.0)

    def draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> float:
        return float(rng.uniform(*self.factor))


class Contrast(_Scaling):
    """Scales pixels away from the image's mean grey by a factor in [1-f, 1+f] (>= 0)."""

    def apply(self, x: np.ndarray, params: float, mask: bool = False) -> np.ndarray:
        if mask or params == 1.0:
            return x
        mean = float(_grey(x).mean())
        lut = np.clip(np.rint(mean + params * (np.arange(256) - mean)), 0, 255).astype(np.uint8)
        return _colour(x, lambda c: np.take(lut, c, out=np.empty_like(c)))


class Saturate(_Scaling):
    """Scales colours away from their grey by a factor in [1-f, 1+f] (>= 0); grey is kept."""

    def apply(self, x: np.ndarray, params: float, mask: bool = False) -> np.ndarray:
        if mask or params == 1.0 or x.ndim < 3 or x.shape[2] < 3:
            return x
        rgb = x[..., :3].astype(np.float32)
        grey = _grey(x)[..., None]
        out = x.copy()
        mixed = grey + np.float32(params) * (rgb - grey)
        out[..., :3] = np.clip(np.rint(mixed), 0, 255)
        return out


class Sampling(Transform):
    """For sequences: keeps one frame every `theta`, from a random start in [0, theta)."""

    sequence_only = True

    def __init__(self, theta: int) -> None:
        if not isinstance(theta, (int, np.integer)) or isinstance(theta, (bool, np.bool_)):
            raise bad_argument("theta", theta, "a positive int")
        if theta < 1:
            raise bad_argument("theta", theta, "a positive int")
        self.theta = int(theta)  # a NumPy int is taken (theta read from a config array)

    def draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> int:
        return int(rng.integers(0, self.theta))

    def frames(self, count: int, params: int) -> range:
        """Which of `count` frames are kept."""
        return range(min(params, max(count - 1, 0)), count, self.theta)


def _grey(x: np.ndarray) -> np.ndarray:
    if x.ndim == 2 or x.shape[2] < 3:
        return (x if x.ndim == 2 else x[..., 0]).astype(np.float32)
    return x[..., :3].astype(np.float32) @ _LUMA


def _colour(x: np.ndarray, fn: Any) -> np.ndarray:
    """Applies a per-value map to the colour channels, leaving alpha as it is."""
    if x.ndim == 3 and x.shape[2] == 4:
        out = x.copy()
        out[..., :3] = fn(x[..., :3])
        return out
    return fn(x)


def _filter(nearest: bool) -> Any:
    from PIL import Image

    return Image.Resampling.NEAREST if nearest else Image.Resampling.BILINEAR


def _with_pillow(x: np.ndarray, op: Any, nearest: bool) -> np.ndarray:
    """Runs a Pillow operation on an (H, W) or (H, W, C) uint8 array.

    Channel by channel when C is not a Pillow mode.
    """
    from PIL import Image

    x = np.ascontiguousarray(x)
    if x.ndim == 2:
        return np.asarray(op(Image.fromarray(x), nearest))
    if x.shape[2] in MODES and x.shape[2] != 1:
        return np.asarray(op(Image.fromarray(x, MODES[x.shape[2]]), nearest))
    planes = [np.asarray(op(Image.fromarray(x[..., c]), nearest)) for c in range(x.shape[2])]
    return np.stack(planes, axis=-1)
