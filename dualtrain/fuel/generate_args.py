"""The arguments of `FuelGenerator.generate`, checked before any work starts."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from dualtrain.errors import bad_argument
from dualtrain.fuel import images
from dualtrain.fuel.layout import format_of

__all__ = [
    "MAX_SIDE", "SETTINGS", "check_depth", "check_generate", "check_setting", "pixel_limit",
    "resolve_settings",
]  # fmt: skip

MAX_SIDE = 65535  # the largest height or width stored: JPEG's limit, ample for training data

# The image settings of `generate` that `FuelGenerator.modify` may also set, with the
# defaults used when neither gives one (height and width have none: they must be given).
SETTINGS: dict[str, Any] = {
    "height": None, "width": None, "channel": 3, "encode": "JPEG", "shards": 1,
    "keep_exif": True, "quality": 90, "depth": "uint8",
}  # fmt: skip


def check_setting(name: str, value: Any) -> None:
    """Raises ArgumentError unless `value` is in the range of the setting `name` on its own.

    The checks across settings (JPEG has no alpha, deep images are grey) wait for generate,
    so that ``modify(channel=4)`` then ``modify(encode="PNG")`` works in either order.
    """
    if name in ("height", "width", "shards"):
        if not _is_int(value) or value < 1:
            raise bad_argument(name, value, "a positive int")
        if name != "shards" and value > MAX_SIDE:
            raise bad_argument(name, value, f"at most {MAX_SIDE} pixels (JPEG's own limit)")
    elif name == "channel":
        if not _is_int(value) or value not in images.MODES:
            raise bad_argument("channel", value, "1, 3 or 4")
    elif name == "encode":
        if not isinstance(value, str) or value.upper() not in images.ENCODINGS:
            raise bad_argument("encode", value, "'JPEG', 'PNG' or 'RAW'")
    elif name == "keep_exif":
        if not isinstance(value, bool):
            raise bad_argument("keep_exif", value, "True or False")
    elif name == "quality":
        if not _is_int(value) or not 1 <= value <= 95:
            raise bad_argument("quality", value, "an int in 1..95")
    elif name == "depth":
        if value not in images.DEPTHS:
            raise bad_argument("depth", value, f"one of {list(images.DEPTHS)}")
    else:
        raise bad_argument("setting", name, f"one of {list(SETTINGS)}")


def resolve_settings(given: Mapping[str, Any], saved: Mapping[str, Any]) -> dict[str, Any]:
    """Each setting: as given to generate, else as set by modify, else its default.

    Raises ArgumentError for a height or width that none of them gives.
    """
    out = {}
    for name, default in SETTINGS.items():
        value = given.get(name)
        out[name] = value if value is not None else saved.get(name, default)
        if out[name] is None:
            raise bad_argument(
                name, None, f"an int given to generate, or set before by modify({name}=...)"
            )
    return out


def check_generate(
    dst_path: str, height: int, width: int, channel: int, encode: str, shards: int,
    quality: int, on_error: str,
) -> None:  # fmt: skip
    """Raises ArgumentError naming the first argument of `generate` out of its range."""
    format_of(dst_path)
    for name, value in (("height", height), ("width", width), ("shards", shards),
                        ("channel", channel), ("encode", encode)):  # fmt: skip
        check_setting(name, value)
    if encode.upper() == "JPEG" and channel == 4:
        raise bad_argument("encode", encode, "'PNG' or 'RAW' for channel=4 (JPEG has no alpha)")
    check_setting("quality", quality)
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
    check_setting("keep_exif", keep_exif)
    check_setting("depth", depth)
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
