"""The last step of a Tank's pipeline: image columns in the Tank's layout (NHWC/NCHW) and scale.

What the user's callback (prep_fn, else fetch_fn) left is checked first. Under NCHW this
step reads an image by position, so it must be channel-last: one whose last axis is not the
pack's channel count but whose axis -3 is, the shape of an image a prep_fn made
``(C, H, W)``, is refused rather than transposed a second time; any other channel count
(a grayscale ``(H, W, 1)`` made from RGB) is the callback's to choose. `scale` multiplies
whatever real dtype the callback returns; products the build-time check of the scale does
not cover (floats, or integers of another dtype than the pack's) are checked per pixel.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dualtrain.errors import ArgumentError, DtypeError, ShapeError, bad_argument
from dualtrain.fuel.casts import Served
from dualtrain.fuel.pack import Pack

_F32 = np.finfo(np.float32)


class Finish:
    """Puts image columns in the Tank's layout and scale, after prep_fn (picklable)."""

    def __init__(
        self, pack: Pack, spec: dict[str, Served], layout: str,
        scale: float | Mapping[str, float] | None,
    ) -> None:  # fmt: skip
        image_keys = [k for k in spec if pack.columns[k]["kind"] in ("image", "sequence")]
        self.kinds = {k: pack.columns[k]["kind"] for k in image_keys}
        self.channel = int(pack.image.get("channel", 3))
        self.depth = np.dtype(pack.image.get("dtype", "uint8"))
        scales: dict[str, float] = {}
        if isinstance(scale, Mapping):
            for key, factor in scale.items():
                if key not in image_keys:
                    raise bad_argument("scale", dict(scale), f"keys among the images {image_keys}")
                scales[key] = self._factor(f"scale[{key!r}]", factor)
        elif scale is not None:
            if not image_keys:
                raise bad_argument("scale", scale, "None when data_specf serves no image column")
            factor = self._factor("scale", scale)
            scales = dict.fromkeys(image_keys, factor)
        self.nchw = layout == "NCHW"
        keys = image_keys if self.nchw else list(scales)
        self.keys = {k: scales.get(k) for k in keys}

    def _factor(self, name: str, value: Any) -> float:
        """A scale whose products with every pixel of the pack's depth are finite float32s.

        The rule, exact for integer depths: float32(|scale|) is a normal float32 (so no
        nonzero pixel flushes to 0 or to a subnormal), and it times the depth's largest
        magnitude (255 for uint8) is at most float32's max. A float32 pack's pixels
        are not bounded by their dtype: their products are checked as they are served.
        """
        if (
            not isinstance(value, (int, float, np.integer, np.floating))
            or isinstance(value, (bool, np.bool_))
            or not math.isfinite(value)
            or value == 0
        ):
            raise bad_argument(name, value, "a finite, non-zero number (1 / 255 gives [0, 1])")
        factor = float(value)
        if self.depth.kind in "iu":
            info = np.iinfo(self.depth)
            largest = float(max(-int(info.min), int(info.max)))
        else:
            largest = 1.0
        high = float(_F32.max) / largest
        with np.errstate(over="ignore", under="ignore"):
            narrow = abs(float(np.float32(factor)))  # the factor the pixels are multiplied by
        # float32 * largest is exact in float64 (24 + 32 bits at most), so this is exact.
        if not float(_F32.tiny) <= narrow or narrow * largest > float(_F32.max):
            raise bad_argument(
                name, value,
                f"a magnitude in [{float(_F32.tiny):.3g}, {high:.4g}], so that every "
                f"{self.depth.name} pixel times it is a finite, normal float32 (and no nonzero "
                "pixel becomes 0)",
            )  # fmt: skip
        return factor

    def __call__(
        self, sample: dict[str, Any], source: str = "prep_fn", row: int | None = None
    ) -> dict[str, Any]:
        at = f"row {row}" if row is not None else "a row"
        for key, factor in self.keys.items():
            if key not in sample:
                continue
            x = sample[key]
            self._check(key, x, source, at, factor is not None)
            if self.nchw:
                x = np.moveaxis(x, -1, -3)
            if factor is None:
                sample[key] = np.ascontiguousarray(x)
            else:
                out = np.empty(x.shape, np.float32)
                with np.errstate(over="ignore", under="ignore", invalid="ignore"):
                    np.multiply(x, np.float32(factor), out=out, dtype=np.float32)
                # `_factor` proved the pack's integer depth safe; anything else is checked.
                if x.dtype != self.depth or self.depth.kind == "f":
                    _check_products(key, x, out, factor, source, at)
                sample[key] = out
        return sample

    def _check(self, key: str, x: Any, source: str, at: str, scaled: bool) -> None:
        """Raises unless `x` is what this step reads: an array (channel-last under NCHW)."""
        if self.nchw:
            rank = 4 if self.kinds[key] == "sequence" else 3
            axes = "(T, H, W, C)" if rank == 4 else "(H, W, C)"
            what = f"layout='NCHW' reads {key!r} channel-last, as {axes}"
            if not isinstance(x, np.ndarray) or x.ndim != rank:
                raise ShapeError(f"{what}; {source} returned {_describe(x)} for {at}")
            # Another channel count is the callback's choice (RGB to grayscale); the pack's
            # count at axis -3 and not at -1 is an image made channel-first already.
            if x.shape[-1] != self.channel and x.shape[-3] == self.channel:
                raise ShapeError(
                    f"{what}; {source} returned shape {x.shape} for {at}, which looks "
                    f"channel-first already (C={self.channel} at axis -3, not -1): return it "
                    "channel-last, or drop layout="
                )
        elif not isinstance(x, np.ndarray):
            raise ShapeError(
                f"scale multiplies {key!r} as an array; {source} returned {_describe(x)} for {at}"
            )
        if scaled and x.dtype.kind not in "iuf":
            raise DtypeError(
                f"scale multiplies {key!r} into float32, so it must be integers or floats; "
                f"{source} returned {x.dtype} for {at}"
            )


def _check_products(
    key: str, x: np.ndarray, out: np.ndarray, factor: float, source: str, at: str
) -> None:
    """Pixels times the scale: finite where they were, nonzero where they were.

    The same rule for a float pack's pixels and for whatever a callback returned: a pixel
    that is inf or NaN already is the data's, not the scale's, and passes as it is.
    """
    bad = (np.isfinite(x) & ~np.isfinite(out)) | ((x != 0) & (out == 0))
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ArgumentError(
            f"scale={factor!r} takes {key!r}'s pixel {x[where]!r} at {where} of {at} (from "
            f"{source}, {x.dtype}) to {out[where]!r} in float32: choose a scale that keeps "
            "it finite and nonzero"
        )


def _describe(x: Any) -> str:
    shape = getattr(x, "shape", None)
    if shape is not None:
        return f"a {type(x).__name__} of shape {tuple(shape)}"
    return f"a {type(x).__name__}"
