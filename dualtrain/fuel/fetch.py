"""The Tank's default fetch_fn: a row's specified columns, images decoded, values cast.

`DefaultFetch(pack, spec)(pack, index)` is what a Tank fetches a row with when no
``fetch_fn`` is given; it runs in the Tank's workers (picklable, it holds no file).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dualtrain.errors import PackError
from dualtrain.fuel import images
from dualtrain.fuel.casts import _check_value, _Served
from dualtrain.fuel.pack import Pack

__all__ = ["DefaultFetch"]


class DefaultFetch:
    """Reads the specified columns of a row; decodes images, casts values to their dtypes."""

    def __init__(self, pack: Pack, spec: dict[str, _Served]) -> None:
        self.spec = spec
        self.kinds = {key: pack.columns[key]["kind"] for key in spec}
        image = pack.image
        shape = tuple(image.get(k) for k in ("height", "width", "channel"))
        # What every stored image must decode to (packs before this metadata: unchecked).
        self.image_shape = shape if None not in shape else None
        self.depth = np.dtype(str(image.get("dtype", "uint8")))

    def __call__(self, pack: Pack, index: int) -> dict[str, Any]:
        sample: dict[str, Any] = {}
        for key, served in self.spec.items():
            value = pack[key][index]
            kind = self.kinds[key]
            if kind == "image":
                sample[key] = self._decode(pack, key, index, value)
            elif kind == "sequence":
                sample[key] = np.stack([self._decode(pack, key, index, f) for f in value])
            elif served.base == "str":
                sample[key] = value
            else:
                stored = np.asarray(value)
                if served.checked:
                    # An overflow becomes the PackError below, naming column and row.
                    with np.errstate(over="ignore", invalid="ignore"):
                        out = stored.astype(served.dtype, copy=False)
                    _check_value(key, index, stored, out)
                else:
                    out = stored.astype(served.dtype, copy=False)
                sample[key] = out
        return sample

    def _decode(self, pack: Pack, key: str, index: int, data: Any) -> np.ndarray:
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
