"""What a custom fetch_fn reads: a pack whose image cells decode when indexed.

A Tank calls ``fetch_fn(data, index)`` with ``data`` a `DecodedPack`, so Nebulae's fetch
functions run as written: ``data["image"][idx]`` is the decoded ``(H, W, C)`` image (a
sequence is ``(T, H, W, C)``) and ``data["label"][idx]`` a NumPy value
(``.astype("int64")`` works). ``data.raw`` is the `Pack` itself, whose image cells are the
encoded bytes. Indexes are ints or NumPy ints; negative ones count from the end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dualtrain.errors import OutOfRangeError, PackError, bad_argument
from dualtrain.fuel import images
from dualtrain.fuel.pack import Pack

__all__ = ["DecodedColumn", "DecodedPack", "ImageCheck", "PackFetch"]


class ImageCheck:
    """Decodes a pack's stored images and checks them against its metadata."""

    def __init__(self, pack: Pack) -> None:
        image = pack.image
        shape = tuple(image.get(k) for k in ("height", "width", "channel"))
        # What every stored image must decode to (packs before this metadata: unchecked).
        self.image_shape = shape if None not in shape else None
        self.depth = np.dtype(str(image.get("dtype", "uint8")))

    def decode(self, pack: Pack, key: str, index: int, data: Any) -> np.ndarray:
        """A stored image decoded, and checked against the pack's size, channels and depth."""
        try:
            out = images.decode(data)
        except Exception as e:  # whatever Pillow or NumPy raise on corrupt bytes
            problem = f"cannot be decoded ({type(e).__name__}: {e})"
        else:
            if self.image_shape is None or (out.shape, out.dtype) == (self.image_shape, self.depth):
                return out
            problem = (
                f"decodes to shape {out.shape} of {out.dtype}; the pack's metadata says "
                f"{self.image_shape} of {self.depth}"
            )
        path = pack.locate(index)[0].path
        raise PackError(
            f"{path}: column {key!r}, row {index}: the stored image {problem}; the pack is "
            "corrupt: generate it again"
        )

    def cell(self, pack: Pack, key: str, kind: str, index: int) -> Any:
        """Row `index` of column `key`: images and sequences decoded, other values as stored."""
        value = pack[key][index]
        if kind == "image":
            return self.decode(pack, key, index, value)
        if kind == "sequence":
            return np.stack([self.decode(pack, key, index, frame) for frame in value])
        return value


class DecodedPack:
    """A pack read with its images decoded: ``data[key][i]``, as Nebulae's fetch_fn read it.

    Args:
        pack: the Pack (`raw` gives it back; its other attributes are reachable here too).
    """

    def __init__(self, pack: Pack) -> None:
        self.raw = pack
        self._images = ImageCheck(pack)

    def __getitem__(self, key: str) -> DecodedColumn:
        self.raw[key]  # an unknown key: the Pack's error, naming the columns
        return DecodedColumn(self, key)

    def __len__(self) -> int:
        return len(self.raw)

    def __contains__(self, key: object) -> bool:
        return key in self.raw.columns

    def keys(self) -> list[str]:
        """The column keys, in CSV order."""
        return self.raw.keys

    def row(self, index: int) -> dict[str, Any]:
        """Every column of row `index`, images decoded."""
        return {key: self[key][index] for key in self.raw.columns}

    def __getattr__(self, name: str) -> Any:
        # The Pack's own attributes (columns, image, locate, check, paths...): code written
        # when fetch_fn received the Pack keeps working.
        if name.startswith("__") or name in ("raw", "_images"):
            raise AttributeError(name)
        return getattr(self.raw, name)

    def __repr__(self) -> str:
        return f"DecodedPack({self.raw.paths!r})"


class DecodedColumn:
    """One column of a `DecodedPack`; ``column[i]`` reads row i (images decoded)."""

    def __init__(self, data: DecodedPack, key: str) -> None:
        self.data, self.key = data, key
        self.kind: str = data.raw[key].kind

    def __len__(self) -> int:
        return len(self.data.raw)

    def __getitem__(self, index: Any) -> Any:
        n = len(self.data.raw)
        if not isinstance(index, (int, np.integer)) or isinstance(index, (bool, np.bool_)):
            raise bad_argument(
                "index", index, f"an int row number of column {self.key!r} (negative from the end)"
            )
        row = int(index) + n if index < 0 else int(index)
        if not 0 <= row < n:
            raise OutOfRangeError(
                f"index {int(index)} is out of range for column {self.key!r} of a pack of "
                f"{n} rows (valid: {-n}..{n - 1})"
            )
        value = self.data._images.cell(self.data.raw, self.key, self.kind, row)
        if isinstance(value, np.ndarray) and not value.flags.writeable:
            # A view of the mapped file: a fetch_fn may change what it read in place, as it
            # could the fresh arrays h5py gave Nebulae's fetch_fn.
            value = value.copy()
        return value

    def __iter__(self) -> Any:
        for i in range(len(self)):
            yield self[i]


class PackFetch:
    """A user's ``fetch_fn(data, index)`` given a `DecodedPack` (picklable if the function is)."""

    def __init__(self, fetch_fn: Callable[[Any, int], Any]) -> None:
        self.fetch_fn = fetch_fn
        self._view: DecodedPack | None = None

    def __call__(self, pack: Pack, index: int) -> Any:
        view = self._view
        if view is None or view.raw is not pack:
            view = self._view = DecodedPack(pack)
        return self.fetch_fn(view, index)

    def __getstate__(self) -> dict[str, Any]:
        return {"fetch_fn": self.fetch_fn, "_view": None}
