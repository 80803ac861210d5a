"""The last step of a Tank's pipeline: image columns in the Tank's layout (NHWC/NCHW) and scale."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.fuel.casts import _Served
from dualtrain.fuel.pack import Pack


class Finish:
    """Puts image columns in the Tank's layout and scale, after prep_fn (picklable)."""

    def __init__(
        self, pack: Pack, spec: dict[str, _Served], layout: str,
        scale: float | Mapping[str, float] | None,
    ) -> None:  # fmt: skip
        image_keys = [k for k in spec if pack.columns[k]["kind"] in ("image", "sequence")]
        scales: dict[str, float] = {}
        if isinstance(scale, Mapping):
            for key, factor in scale.items():
                if key not in image_keys:
                    raise bad_argument("scale", dict(scale), f"keys among the images {image_keys}")
                scales[key] = _factor(f"scale[{key!r}]", factor)
        elif scale is not None:
            if not image_keys:
                raise bad_argument("scale", scale, "None when data_specf serves no image column")
            factor = _factor("scale", scale)
            scales = dict.fromkeys(image_keys, factor)
        self.nchw = layout == "NCHW"
        keys = image_keys if self.nchw else list(scales)
        self.keys = {k: scales.get(k) for k in keys}

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        for key, factor in self.keys.items():
            if key not in sample:
                continue
            x = sample[key]
            if not isinstance(x, np.ndarray) or x.ndim not in (3, 4):
                raise ArgumentError(
                    f"{key!r} must be an (H, W, C) image or (T, H, W, C) sequence array for "
                    f"the Tank's layout or scale; prep_fn left a {_describe(x)}"
                )
            if self.nchw:
                x = np.moveaxis(x, -1, -3)
            if factor is None:
                sample[key] = np.ascontiguousarray(x)
            else:
                out = np.empty(x.shape, np.float32)
                sample[key] = np.multiply(x, np.float32(factor), out=out, dtype=np.float32)
        return sample


def _factor(name: str, value: Any) -> float:
    if (
        not isinstance(value, (int, float, np.integer, np.floating))
        or isinstance(value, (bool, np.bool_))
        or not math.isfinite(value)
        or value == 0
    ):
        raise bad_argument(name, value, "a finite, non-zero number (1 / 255 gives [0, 1])")
    return float(value)


def _describe(x: Any) -> str:
    shape = getattr(x, "shape", None)
    return f"shape {tuple(shape)}" if shape is not None else type(x).__name__
