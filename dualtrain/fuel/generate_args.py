"""The arguments of `FuelGenerator.generate`, checked before any work starts."""

from __future__ import annotations

import os

import numpy as np

from dualtrain.errors import bad_argument
from dualtrain.fuel import images
from dualtrain.fuel.layout import format_of

__all__ = ["MAX_SIDE", "check_depth", "check_generate", "pixel_limit"]

MAX_SIDE = 65535  # the largest height or width stored: JPEG's limit, ample for training data


def check_generate(
    dst_path: str, height: int, width: int, channel: int, encode: str, shards: int,
    quality: int, on_error: str,
) -> None:  # fmt: skip
    """Raises ArgumentError naming the first argument of `generate` out of its range."""
    format_of(dst_path)
    for name, value in (("height", height), ("width", width), ("shards", shards)):
        if not _is_int(value) or value < 1:
            raise bad_argument(name, value, "a positive int")
    for name, value in (("height", height), ("width", width)):
        if value > MAX_SIDE:
            raise bad_argument(name, value, f"at most {MAX_SIDE} pixels (JPEG's own limit)")
    if not _is_int(channel) or channel not in images.MODES:
        raise bad_argument("channel", channel, "1, 3 or 4")
    if not isinstance(encode, str) or encode.upper() not in images.ENCODINGS:
        raise bad_argument("encode", encode, "'JPEG', 'PNG' or 'RAW'")
    if encode.upper() == "JPEG" and channel == 4:
        raise bad_argument("encode", encode, "'PNG' or 'RAW' for channel=4 (JPEG has no alpha)")
    if not _is_int(quality) or not 1 <= quality <= 95:
        raise bad_argument("quality", quality, "an int in 1..95")
    if on_error not in ("raise", "skip"):
        raise bad_argument("on_error", on_error, "'raise' or 'skip'")
    folder = os.path.dirname(os.path.abspath(dst_path))
    if not os.path.isdir(folder):
        raise bad_argument("dst_path", dst_path, "a path in an existing folder")


def _is_int(value: object) -> bool:
    """An int and not a bool (``True`` is an int to Python, never a count here)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_depth(depth: object, channel: int, encode: str, keep_exif: object) -> None:
    """Raises ArgumentError unless `depth` can be stored with this `channel` and `encode`."""
    if not isinstance(keep_exif, bool):
        raise bad_argument("keep_exif", keep_exif, "True or False")
    if depth not in images.DEPTHS:
        raise bad_argument("depth", depth, f"one of {list(images.DEPTHS)}")
    if depth == "uint8":
        return
    if channel != 1:
        raise bad_argument("channel", channel, f"1 for depth={depth!r} (deep images are grey)")
    allowed = ("PNG", "RAW") if depth == "uint16" else ("RAW",)
    if encode not in allowed:
        raise bad_argument("encode", encode, f"one of {list(allowed)} for depth={depth!r}")


def pixel_limit(max_image_pixels: object) -> int | None:
    """The pixel limit of a run; refuses one that Pillow's own, process-wide limit undercuts."""
    from PIL import Image

    pillow = Image.MAX_IMAGE_PIXELS
    if max_image_pixels is None:
        return pillow
    if not _is_int(max_image_pixels) or max_image_pixels < 1:  # type: ignore[operator]
        raise bad_argument("max_image_pixels", max_image_pixels, "a positive int or None")
    if pillow is not None and max_image_pixels > pillow:  # type: ignore[operator]
        raise bad_argument(
            "max_image_pixels",
            max_image_pixels,
            f"at most PIL.Image.MAX_IMAGE_PIXELS={pillow}, which Pillow checks first for "
            "the whole process (raise it, or set it to None, to accept larger images)",
        )
    return int(max_image_pixels)  # type: ignore[call-overload]
