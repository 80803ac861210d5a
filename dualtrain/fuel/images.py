"""Image decoding and encoding with Pillow, shared by the pack writer and the Tank.

Pillow releases the GIL while it decodes, encodes and resizes, so these functions scale
over threads. Arrays are ``uint8`` of shape ``(height, width, channel)``, channel 1, 3 or 4.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from dualtrain.errors import bad_argument

__all__ = ["ENCODINGS", "MODES", "decode", "encode", "prepare"]

MODES = {1: "L", 3: "RGB", 4: "RGBA"}  # channel count -> Pillow mode
ENCODINGS = ("JPEG", "PNG")


def prepare(
    raw: bytes, height: int, width: int, channel: int, *, keep_exif: bool
) -> tuple[Any, bytes]:
    """Decodes a raw image file, applies its EXIF orientation, converts and resizes it.

    Args:
        raw: the file's bytes, any format Pillow reads.
        height: the output height in pixels.
        width: the output width in pixels.
        channel: 1 (grey), 3 (RGB) or 4 (RGBA).
        keep_exif: also return the file's EXIF block (b"" when it has none).

    Returns:
        (a Pillow image in the `channel` mode at height x width, EXIF bytes or b"").

    Raises:
        OSError: Pillow cannot read the bytes (unknown format, truncated or corrupt file).
    """
    from PIL import Image, ImageOps

    with Image.open(io.BytesIO(raw)) as opened:
        opened.load()  # corrupt data fails here, not at a later, lazier step
        exif = opened.info.get("exif", b"") if keep_exif else b""
        img: Any = ImageOps.exif_transpose(opened)
        if img.mode != MODES[channel]:
            img = img.convert(MODES[channel])
        if img.size != (width, height):
            img = img.resize((width, height), Image.Resampling.BICUBIC)
        return img, bytes(exif)


def encode(img: Any, encode: str, quality: int) -> bytes:
    """Encodes a Pillow image as JPEG (at `quality`) or PNG (lossless)."""
    buf = io.BytesIO()
    if encode == "JPEG":
        img.save(buf, format="JPEG", quality=quality)
    else:
        img.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def decode(data: Any, channel: int | None = None) -> np.ndarray:
    """Decodes encoded image bytes (a bytes object or a uint8 array) to ``(H, W, C)`` uint8.

    Args:
        data: JPEG or PNG bytes.
        channel: convert to 1, 3 or 4 channels; None keeps the stored mode.
    """
    from PIL import Image

    with Image.open(io.BytesIO(_as_bytes(data))) as opened:
        img: Any = opened
        if channel is not None and img.mode != MODES[channel]:
            img = img.convert(MODES[channel])
        else:
            img.load()
        out = np.asarray(img)
    return out[:, :, None] if out.ndim == 2 else out


def _as_bytes(data: Any) -> Any:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return data
    if isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 1:
        return data.data
    raise bad_argument("data", type(data).__name__, "encoded image bytes or a 1-D uint8 array")
