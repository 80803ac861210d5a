"""Image decoding and encoding with Pillow, shared by the pack writer and the Tank.

Pillow releases the GIL while it decodes, encodes and resizes, so these functions scale
over threads. Arrays are of shape ``(height, width, channel)``, channel 1, 3 or 4.

Bit depth. A pack stores its images at one pixel dtype, its *depth*: ``"uint8"`` (8 bits
per sample, 1, 3 or 4 channels) or, for one-channel images, ``"uint16"`` (16-bit PNG or
TIFF), ``"int32"`` (32-bit integer TIFF) or ``"float32"`` (32-bit float TIFF). An image whose
samples are deeper than the pack's depth is refused, never scaled or clipped: a 16-bit PNG
converted to 8 bits by Pillow's ``convert`` would read as all 255. Colour images of more
than 8 bits per sample are refused at every depth: Pillow reads them at 8 bits only.

Encodings: ``"JPEG"`` (uint8 only), ``"PNG"`` (uint8, or uint16 with one channel) and
``"RAW"``: the array as NumPy ``.npy`` bytes (any depth, uncompressed), read back by
`decode` with its dtype and shape.
"""

from __future__ import annotations

import io
import re
from typing import Any

import numpy as np

from dualtrain.errors import DtypeError, bad_argument

__all__ = [
    "DEPTHS",
    "ENCODINGS",
    "MAX_IMAGE_PIXELS",
    "MODES",
    "ImageError",
    "as_stored",
    "decode",
    "encode",
    "prepare",
]

MODES = {1: "L", 3: "RGB", 4: "RGBA"}  # channel count -> Pillow mode
ENCODINGS = ("JPEG", "PNG", "RAW")
DEPTHS = ("uint8", "uint16", "int32", "float32")
# Pillow's own default decompression-bomb limit (PIL.Image.MAX_IMAGE_PIXELS): a 0.25 GiB
# RGB image. Larger images are refused unless generate's max_image_pixels is raised.
MAX_IMAGE_PIXELS = 1024 * 1024 * 1024 // 4 // 3
_NPY_MAGIC = b"\x93NUMPY"
_ORIENTATION = 0x0112  # the EXIF orientation tag
# The deep one-channel Pillow modes and the depth they hold.
_DEEP_MODES = {
    "I;16": "uint16",
    "I;16L": "uint16",
    "I;16B": "uint16",
    "I;16N": "uint16",
    "I": "int32",
    "F": "float32",
}


# Raw modes of 16 bits per *pixel* (5-6-5 or 5-5-5 colour in BMP, TGA...): 8-bit-or-less
# samples, which Pillow reads exactly.
_PACKED = {f"{m};{b}" for m in ("RGB", "BGR", "RGBA", "BGRA", "BGRX", "RGBX") for b in (15, 16)}


def _raw_mode(tile: Any) -> str:
    """The raw mode of one of a Pillow image's tiles ("" when it has none)."""
    args = tile[3] if isinstance(tile, tuple) and len(tile) > 3 else None  # codec's args
    if isinstance(args, tuple):
        args = args[0] if args else None
    return args if isinstance(args, str) else ""


class ImageError(ValueError):
    """A raw image cannot be packed; the message says why (the caller adds file and line)."""


def source_depth(img: Any) -> str:
    """The depth of an opened (not yet loaded) Pillow image's samples, as `DEPTHS` names it.

    Raises:
        ImageError: an image Pillow would read inexactly: more than 8 bits per sample in an
            8-bit mode (16-bit colour PNG/TIFF, read at 8), unsigned 32-bit samples (read
            as signed).
    """
    raw_modes = [_raw_mode(tile) for tile in (img.tile or ())]
    # TIFF's SampleFormat tag: 2 is signed integer. Pillow opens signed 8-bit samples in
    # its unsigned mode "L" (-5 would read as 251); signed 16-bit ones it widens to "I".
    sample_format = getattr(img, "tag_v2", {}).get(339) if img.format == "TIFF" else None
    formats = sample_format if isinstance(sample_format, tuple) else (sample_format,)
    if 2 in formats and img.mode not in ("I", "F"):
        raise ImageError(
            f"holds signed integer samples (TIFF SampleFormat 2) that Pillow reads as "
            f"unsigned (mode {img.mode}); no pack depth holds them exactly: convert it to "
            "int32 (or to unsigned values) first"
        )
    if img.mode in _DEEP_MODES:
        # Pillow reads unsigned 32-bit TIFF samples into its signed mode "I": values over
        # 2**31 - 1 would come back negative.
        unsigned = [m for m in raw_modes if re.fullmatch(r"I;32[BLN]?", m)]
        if unsigned:
            raise ImageError(
                f"holds unsigned 32-bit samples (raw mode {unsigned[0]}), which no pack "
                "depth holds exactly (int32 would turn values over 2**31 - 1 negative); "
                "convert it to int32 or float32 first"
            )
        return _DEEP_MODES[img.mode]
    # Pillow opens 16-bit colour PNG/TIFF in an 8-bit mode and drops the low byte while
    # decoding; the tile's raw mode ("RGB;16B") still tells the stored depth.
    deep = [m for m in raw_modes if m not in _PACKED and re.search(r";(16|32|64)", m)]
    if deep:
        raise ImageError(
            f"is a {img.mode} image of more than 8 bits per sample (raw mode {deep[0]}); "
            "Pillow reads it at 8 bits only: convert it to 8 bits, or to 16-bit grey for "
            "depth='uint16'"
        )
    return "uint8"


def prepare(
    raw: bytes,
    height: int,
    width: int,
    channel: int,
    *,
    keep_exif: bool,
    depth: str = "uint8",
    max_pixels: int | None = MAX_IMAGE_PIXELS,
) -> tuple[Any, bytes]:
    """Decodes a raw image file, applies its EXIF orientation, converts and resizes it.

    Args:
        raw: the file's bytes, any format Pillow reads.
        height: the output height in pixels.
        width: the output width in pixels.
        channel: 1 (grey), 3 (RGB) or 4 (RGBA); 1 for depths other than uint8.
        keep_exif: also return the file's EXIF block (b"" when it has none).
        depth: the pixel dtype to keep, one of `DEPTHS`; the image's own depth must match
            (uint8 images take any 8-bit mode and are converted to `channel`).
        max_pixels: the most pixels (width x height) the file may declare, checked from
            its header before any pixel is decoded; None for no limit.

    Returns:
        (a Pillow image at height x width: in the `channel` mode for uint8, else in the
        deep one-channel mode, EXIF bytes or b"").

    Raises:
        ImageError: the image is too large or of another depth.
        Exception: whatever Pillow raises on an unreadable, truncated or corrupt file
            (OSError mostly; callers catch broadly).
    """
    from PIL import Image, ImageOps

    with Image.open(io.BytesIO(raw)) as opened:
        pixels = opened.size[0] * opened.size[1]
        if max_pixels is not None and pixels > max_pixels:
            raise ImageError(
                f"has {opened.size[0]} x {opened.size[1]} = {pixels} pixels, over "
                f"max_image_pixels={max_pixels} (a decompression-bomb guard; raise it to "
                "accept larger images)"
            )
        found = source_depth(opened)
        if found != depth:
            hint = (
                f"pass depth={found!r} (one channel; encode 'RAW', or 'PNG' for uint16) to "
                "store it as it is"
                if found != "uint8"
                else "8-bit images are not widened: pack them apart, at depth 'uint8'"
            )
            raise ImageError(
                f"holds {found} samples (Pillow mode {opened.mode}), but the pack's depth is "
                f"{depth!r}; {hint}"
            )
        opened.load()  # corrupt data fails here, not at a later, lazier step
        exif = opened.info.get("exif", b"") if keep_exif else b""
        img: Any = ImageOps.exif_transpose(opened)
        if exif:
            exif = _upright_exif(bytes(exif))
        if img.mode in _DEEP_MODES and img.mode not in ("I;16", "I", "F"):
            # Pillow resizes byte-swapped 16-bit modes (I;16B, and I;16N/I;16L on a
            # big-endian host) as if they were native, giving garbage: make them native.
            img = Image.fromarray(to_array(img)[:, :, 0].astype(np.uint16))
        if depth == "uint8" and img.mode != MODES[channel]:
            img = img.convert(MODES[channel])
        if img.size != (width, height):
            img = img.resize((width, height), Image.Resampling.BICUBIC)
        return img, bytes(exif)


# What a complete file ends with: JPEG's end-of-image marker, PNG's IEND chunk (and CRC).
_ENDS = {"JPEG": (b"\xff\xd9",), "PNG": (b"IEND\xaeB`\x82",)}


def as_stored(
    raw: bytes,
    height: int,
    width: int,
    channel: int,
    encode: str,
    *,
    keep_exif: bool,
    depth: str = "uint8",
    max_pixels: int | None = MAX_IMAGE_PIXELS,
) -> bytes | None:
    """The EXIF block to store beside `raw` when the file can be packed as it is, else None.

    A file is packed as it is (its bytes, not decoded and re-encoded) when decoding it gives
    what `prepare` then `encode` would store, short of the re-encoding's loss: it is in the
    `encode` format (JPEG or PNG), `width` x `height`, in the `channel` mode at `depth`
    (uint8), upright (no orientation other than 1, in EXIF, XMP or a PNG text chunk),
    without an EXIF block unless `keep_exif` (re-encoding drops it from the stored file),
    and whole: it ends with the format's end marker and decodes, so a truncated or corrupt
    file is a bad row at packing, as under `prepare`. It is decoded once, to check it, but
    not re-encoded.

    Returns:
        The file's EXIF block (b"" when it has none), or None: `prepare` it instead.
    """
    from PIL import Image

    ends = _ENDS.get(encode)
    if ends is None or depth != "uint8" or not raw.rstrip(b"\x00").endswith(ends):
        return None
    with Image.open(io.BytesIO(raw)) as opened:
        if opened.format != encode or opened.size != (width, height):
            return None
        if max_pixels is not None and width * height > max_pixels:
            return None  # prepare raises the guard's own error
        if opened.mode != MODES[channel] or source_depth(opened) != "uint8":
            return None
        # Decoded as prepare decodes it: a file corrupt inside is a bad row here, not an
        # error when the pack is read; and a PNG's eXIf chunk after its pixels is read.
        opened.load()
        # Orientation wherever Pillow finds it (EXIF, XMP, a PNG text chunk), as
        # prepare's exif_transpose reads it.
        if opened.getexif().get(_ORIENTATION, 1) != 1:
            return None  # prepare turns it upright
        exif = opened.info.get("exif", b"")
        if exif and not keep_exif:
            return None  # prepare drops it from the stored file
        return bytes(exif)


def _upright_exif(exif: bytes) -> bytes:
    """`exif` with its orientation tag set to 1: the stored pixels are already upright."""
    from PIL import Image

    parsed = Image.Exif()
    parsed.load(exif)
    if parsed.get(_ORIENTATION, 1) == 1:
        return exif
    parsed[_ORIENTATION] = 1
    return bytes(parsed.tobytes())


def to_array(img: Any) -> np.ndarray:
    """A Pillow image as a native-endian ``(H, W, C)`` array of its depth."""
    out = np.asarray(img)
    out = out.astype(out.dtype.newbyteorder("="), copy=False)
    return out[:, :, None] if out.ndim == 2 else out


def encode(img: Any, encode: str, quality: int) -> bytes:
    """Encodes a Pillow image as JPEG (at `quality`), PNG (lossless) or RAW (``.npy``).

    Raises:
        DtypeError: the image's depth does not fit the encoding (JPEG holds uint8 only, PNG
            uint8 and one-channel uint16).
    """
    if encode == "RAW":
        buf = io.BytesIO()
        np.lib.format.write_array(buf, to_array(img), allow_pickle=False)
        return buf.getvalue()
    deep = _DEEP_MODES.get(img.mode)
    if deep is not None and not (encode == "PNG" and deep == "uint16"):
        raise DtypeError(
            f"encode={encode!r} cannot hold {deep} images; use encode='RAW'"
            + (" or 'PNG'" if deep == "uint16" else "")
        )
    buf = io.BytesIO()
    if encode == "JPEG":
        img.save(buf, format="JPEG", quality=quality)
    else:
        if deep is not None and img.mode != "I;16":
            from PIL import Image

            img = Image.fromarray(to_array(img)[:, :, 0].astype(np.uint16))
        img.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def decode(data: Any, channel: int | None = None) -> np.ndarray:
    """Decodes stored image bytes (bytes or a 1-D uint8 array) to an ``(H, W, C)`` array.

    The array has the pack's depth: uint8, or uint16 / int32 / float32 for deep images.

    Args:
        data: JPEG, PNG or RAW (``.npy``) bytes; an array decoded already (2-D or 3-D)
            is returned as it is (converted to `channel` when given).
        channel: convert to 1, 3 or 4 channels; None keeps the stored mode. Only uint8
            images convert.
    """
    from PIL import Image

    if channel is not None and (
        not isinstance(channel, (int, np.integer))
        or isinstance(channel, (bool, np.bool_))
        or int(channel) not in MODES
    ):
        raise bad_argument("channel", channel, f"None or one of {sorted(MODES)}")
    if isinstance(data, np.ndarray) and data.ndim in (2, 3):
        out = data  # decoded already: a Tank's custom fetch_fn reads images decoded
    else:
        raw = _as_bytes(data)
        if bytes(raw[: len(_NPY_MAGIC)]) != _NPY_MAGIC:
            with Image.open(io.BytesIO(raw)) as opened:
                if channel is not None and opened.mode in _DEEP_MODES:
                    raise bad_argument("channel", channel, "None for a deep image")
                return decode_pil(opened, channel)
        out = np.lib.format.read_array(io.BytesIO(raw), allow_pickle=False)
    if out.ndim == 2:
        out = out[:, :, None]
    if channel is not None and out.shape[-1] != channel:
        if out.dtype != np.uint8:
            raise bad_argument("channel", channel, f"None or {out.shape[-1]} for a deep image")
        squeezed = out[:, :, 0] if out.shape[-1] == 1 else out
        return decode_pil(Image.fromarray(squeezed), channel)
    return out


def decode_pil(img: Any, channel: int | None) -> np.ndarray:
    """An opened Pillow image as ``(H, W, C)``, converted to `channel` when given."""
    if channel is not None and img.mode != MODES[channel]:
        img = img.convert(MODES[channel])
    else:
        img.load()
    return to_array(img)


def _as_bytes(data: Any) -> Any:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return data
    if isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 1:
        return data.data
    raise bad_argument("data", type(data).__name__, "encoded image bytes or a 1-D uint8 array")
