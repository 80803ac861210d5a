"""A Craft anchor's manifest: built at `drop`, read and checked at `to`, in any format read.

The manifest is the JSON in the anchor's header: format, backend, Craft class and scope,
dualtrain version, step, ``extra``, each tensor's shape and dtype (and, added by the
caller, the optimizer's and scheduler's entries). Its words are
``checkpoint.vocabulary``'s; a manifest of an older format is read in today's words.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.checkpoint import embeddings
from dualtrain.checkpoint.anchor_file import Anchor
from dualtrain.checkpoint.vocabulary import CRAFT_FORMAT, CRAFT_READS, WITHOUT_CRC, upgrade
from dualtrain.version import __version__

__all__ = [
    "FORMAT",
    "LEGACY_FORMATS",
    "OLDER_FORMATS",
    "checked_manifest",
    "craft_manifest",
    "is_plain",
    "plain_manifest",
    "read_manifest",
]

FORMAT = CRAFT_FORMAT
# Older formats that still load: with their CRC-32s (OLDER), or before them (LEGACY).
OLDER_FORMATS = tuple(f for f in CRAFT_READS[1:] if f not in WITHOUT_CRC)
LEGACY_FORMATS = tuple(f for f in CRAFT_READS[1:] if f in WITHOUT_CRC)


def craft_manifest(
    craft: Any, tensors: dict[str, np.ndarray], step: int | None, extra: dict[str, Any] | None
) -> dict[str, Any]:
    """The manifest of an anchor of realized `craft` holding `tensors` (before its optimizer)."""
    return {
        "format": FORMAT,
        "backend": craft.dualtrain_backend,
        "craft": type(craft.craft).__name__,
        "scope": craft.craft.scope,
        "dualtrain": __version__,
        "layout": "canonical",
        "step": None if step is None else int(step),
        "extra": extra or {},
        "names": {k: {"shape": list(v.shape), "dtype": v.dtype.name} for k, v in tensors.items()},
    }


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def checked_manifest(anchor: Anchor) -> dict[str, Any]:
    """A Craft anchor's manifest, checked against itself and against the file's tensors.

    In this version's words (``checkpoint.vocabulary.upgrade``), whatever format wrote it.
    """
    manifest = upgrade(anchor.manifest(FORMAT, LEGACY_FORMATS, OLDER_FORMATS))
    names, tensors = manifest.get("names"), manifest.get("tensors")
    if not isinstance(names, dict):
        raise anchor.error("has a malformed manifest: 'names' is not an object")
    if (
        not isinstance(tensors, list)
        or not all(isinstance(t, str) for t in tensors)
        or sorted(tensors) != sorted(anchor.entries)
    ):
        raise anchor.error("has a malformed manifest: 'tensors' does not list the file's tensors")
    for name, spec in names.items():
        entry = anchor.entries.get(name)
        if entry is None:
            raise anchor.error(f"has a malformed manifest: {name!r} is listed but not stored")
        if (
            not isinstance(spec, dict)
            or spec.get("shape") != list(entry.shape)
            or spec.get("dtype") != entry.dtype.name
        ):
            raise anchor.error(
                f"is corrupt: {name!r} is {entry.shape} {entry.dtype.name} in the file but "
                f"{spec!r} in the manifest"
            )
    checks = {
        "step": (lambda v: v is None or _is_int(v), "an int or null"),
        "extra": (lambda v: isinstance(v, dict), "an object"),
        "scope": (lambda v: v is None or isinstance(v, str), "a string"),
        "optimizer": (lambda v: v is None or isinstance(v, dict), "an object"),
    }
    for key, (ok, expected) in checks.items():
        if not ok(manifest.get(key, {} if key == "extra" else None)):
            raise anchor.error(
                f"has a malformed manifest: {key!r} is {manifest[key]!r}, expected {expected}"
            )
    return manifest


def is_plain(anchor: Anchor) -> bool:
    """Whether `anchor` is a plain safetensors file (no dualtrain manifest): a state_dict."""
    return "dualtrain" not in anchor.metadata


def plain_manifest(anchor: Anchor) -> dict[str, Any]:
    """The manifest `TimeMachine.to` reads a plain safetensors file with: its tensors only.

    Every tensor is a parameter or buffer under its name (torch's ``state_dict`` names, the
    neutral names), in the canonical layout; there is no step, extra, optimizer or CRC.
    """
    return {
        "format": "safetensors",
        "step": None,
        "extra": {},
        "names": {
            k: {"shape": list(e.shape), "dtype": e.dtype.name} for k, e in anchor.entries.items()
        },
        "tensors": sorted(anchor.entries),
    }


def read_manifest(path: Path, expected: str = FORMAT) -> dict[str, Any]:
    """The manifest of the anchor at `path`, read without loading any tensor, and checked.

    `expected` is the format the caller reads (Craft anchors or embedding anchors). What
    tests and tools read an anchor's manifest with.
    """
    anchor = Anchor(path)
    if expected == FORMAT:
        return checked_manifest(anchor)
    return upgrade(anchor.manifest(expected, embeddings.LEGACY_FORMATS, embeddings.OLDER_FORMATS))
