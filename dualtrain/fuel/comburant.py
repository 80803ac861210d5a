"""Comburant: seeded augmentation of an image (and its mask) or a sequence of frames."""

from __future__ import annotations

from typing import Any

import numpy as np

from dualtrain.errors import ArgumentError, DtypeError, ShapeError, bad_argument
from dualtrain.fuel.streams import AUGMENT, SampleKey, current_sample, stream
from dualtrain.fuel.transforms import Transform
from dualtrain.validate import SEED_LIMIT

__all__ = ["Comburant"]


class Comburant:
    """Applies `transforms` in order, with parameters drawn per sample.

    Draws come from a counter-based stream keyed by (seed, epoch, row index) and the
    transform's position, so a sample gets the same augmentation whichever worker, thread,
    process or framework prepares it. Inside a Tank's `prep_fn` the key is the sample in
    hand; elsewhere pass ``key=(seed, epoch, index)``.

    Images are channel-last, ``(H, W, C)``, unless `layout` says otherwise: with the default
    ``layout=None`` an array that looks channel-first (``(3, 32, 32)``: a first axis of 1, 3
    or 4 and a last one of none of these) is refused rather than augmented along the wrong
    axes; ``layout="CHW"`` takes (and returns) ``(C, H, W)`` frames, and ``layout="HWC"``
    takes any last axis as the channels.

    Example::

        augment = Comburant(Flip(), Crop(area=(0.5, 1.0)), Brighten(0.1))
        tank = Tank(path, {"image": "uint8", "label": "int64"}, 64,
                    prep_fn=lambda s: {**s, "image": augment(s["image"])})
    """

    def __init__(self, *transforms: Transform, layout: str | None = None) -> None:
        for i, t in enumerate(transforms):
            if not isinstance(t, Transform):
                raise bad_argument(f"transforms[{i}]", t, "a dualtrain.fuel transform")
        if layout not in _LAYOUTS:
            raise bad_argument("layout", layout, "None, 'HWC' or 'CHW'")
        self.transforms = transforms
        self.layout = layout

    def __call__(self, image: Any, mask: Any = None, *, key: Any = None) -> Any:
        """Augments one sample.

        Args:
            image: uint8 ``(H, W)`` or ``(H, W, C)``; a sequence is a list of such frames
                or a ``(T, H, W, C)`` array.
            mask: an optional label map (or sequence of them) moved by the same geometric
                draws, with nearest-neighbour resampling; photometric transforms skip it.
            key: a SampleKey or (seed, epoch, index); None takes the Tank's sample in hand.

        Returns:
            The augmented image (same shape and dtype), or (image, mask) when a mask is given.
        """
        sample = _key(key)
        is_seq = isinstance(image, (list, tuple)) or (
            isinstance(image, np.ndarray) and image.ndim == 4
        )
        frames = _frames("image", image, is_seq, self.layout)
        masks = None if mask is None else _frames("mask", mask, is_seq, self.layout)
        if masks is not None and len(masks) != len(frames):
            raise ShapeError(f"mask has {len(masks)} frames; image has {len(frames)}")
        _same_size("image", frames, frames[0].shape)
        if masks is not None:
            _same_size("mask", masks, frames[0].shape)
        for position, t in enumerate(self.transforms):
            rng = stream(sample.seed, AUGMENT, sample.epoch, sample.index, position)
            params = t.draw(rng, frames[0].shape)
            if t.sequence_only:
                if not is_seq:
                    raise ArgumentError(f"{t!r} acts on sequences; got one image")
                kept = list(t.frames(len(frames), params))  # type: ignore[attr-defined]
                frames = [frames[i] for i in kept]
                masks = None if masks is None else [masks[i] for i in kept]
                continue
            frames = [t.apply(f, params) for f in frames]
            if masks is not None and t.geometric:
                masks = [t.apply(m, params, mask=True) for m in masks]
        out = _unframe(image, frames, is_seq, self.layout)
        return out if masks is None else (out, _unframe(mask, masks, is_seq, self.layout))


def _key(key: Any) -> SampleKey:
    if key is None:
        sample = current_sample()
        if sample is None:
            raise bad_argument("key", None, "(seed, epoch, index) outside a Tank's prep_fn")
        return sample
    if isinstance(key, SampleKey):
        key = (key.seed, key.epoch, key.index)
    if (
        isinstance(key, tuple)
        and len(key) == 3
        and all(
            isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)) for k in key
        )
    ):
        # The seed is a 64-bit word of the Philox key, the epoch and index words of its
        # counter, which NumPy takes below 2**63: a larger one would overflow there (or,
        # reduced, name another sample's stream).
        seed, epoch, index = key
        if not (0 <= seed < SEED_LIMIT and 0 <= epoch < WORD_LIMIT and 0 <= index < WORD_LIMIT):
            raise bad_argument(
                "key", key, "(seed, epoch, index): a seed in [0, 2**64), epoch and index in "
                "[0, 2**63)"
            )  # fmt: skip
        # NumPy ints (an index from np.arange) key the same stream as the Python ints.
        return SampleKey(*(int(k) for k in key))
    raise bad_argument("key", key, "a SampleKey or a (seed, epoch, index) tuple of ints")


WORD_LIMIT = 2**63  # epochs and indexes a sample key may name (Philox counter words)
_LAYOUTS = (None, "HWC", "CHW")
_CHANNELS = (1, 3, 4)  # the channel counts of grey, RGB and RGBA images


def _frames(name: str, x: Any, is_seq: bool, layout: str | None) -> list[np.ndarray]:
    """The frames of `x` as channel-last arrays (views)."""
    frames = list(x) if is_seq else [x]
    if not frames:
        raise bad_argument(name, x, "a non-empty sequence of frames")
    axes = "(C, H, W)" if layout == "CHW" else "(H, W, C)"
    for f in frames:
        if not isinstance(f, np.ndarray) or f.ndim not in (2, 3):
            raise ShapeError(f"{name} must be (H, W) or {axes} arrays; got {_describe(f)}")
        if f.dtype != np.uint8:
            raise DtypeError(f"{name} must be uint8; got dtype {f.dtype}")
        if (
            layout is None
            and f.ndim == 3
            and f.shape[0] in _CHANNELS
            and f.shape[2] not in _CHANNELS
        ):
            raise ShapeError(
                f"{name} of shape {f.shape} looks channel-first (C, H, W); Comburant takes "
                "(H, W, C) images: pass Comburant(..., layout='CHW') for channel-first "
                "arrays, or layout='HWC' if the last axis really holds the channels"
            )
        if (
            layout == "CHW"
            and f.ndim == 3
            and f.shape[0] not in _CHANNELS
            and (f.shape[2] in _CHANNELS)
        ):
            raise ShapeError(
                f"{name} of shape {f.shape} looks channel-last (H, W, C), but layout='CHW' "
                "takes (C, H, W) arrays: drop layout='CHW' for channel-last images"
            )
    if layout == "CHW":
        frames = [np.moveaxis(f, 0, -1) if f.ndim == 3 else f for f in frames]
    return frames


def _same_size(name: str, frames: list[np.ndarray], image: tuple[int, ...]) -> None:
    """Every frame has the (H, W) of `image`, the first frame's shape.

    A transform draws one crop or angle for all of them, so another size would be cut out
    of the wrong place.
    """
    for i, f in enumerate(frames):
        if f.shape[:2] != image[:2]:
            where = f"{name} frame {i}" if len(frames) > 1 else name
            raise ShapeError(
                f"{where} has shape {f.shape}, the image (first frame) shape {image}: their "
                "(H, W) must match (an image, its frames and its mask are one size)"
            )


def _unframe(original: Any, frames: list[np.ndarray], is_seq: bool, layout: str | None) -> Any:
    if layout == "CHW":
        frames = [np.moveaxis(f, -1, 0) if f.ndim == 3 else f for f in frames]
    if not is_seq:
        return np.ascontiguousarray(frames[0])
    if isinstance(original, np.ndarray):
        return np.stack(frames)
    return [np.ascontiguousarray(f) for f in frames]


def _describe(x: Any) -> str:
    shape = getattr(x, "shape", None)
    return f"shape {tuple(shape)}" if shape is not None else type(x).__name__
