"""The Tank's default fetch_fn: a row's specified columns, images decoded, values cast.

`DefaultFetch(pack, spec)(pack, index)` is what a Tank fetches a row with when no
``fetch_fn`` is given; it runs in the Tank's workers (picklable, it holds no file).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dualtrain.fuel.casts import Served, check_value
from dualtrain.fuel.decoded import ImageCheck
from dualtrain.fuel.pack import Pack

__all__ = ["DefaultFetch"]


class DefaultFetch:
    """Reads the specified columns of a row; decodes images, casts values to their dtypes."""

    def __init__(self, pack: Pack, spec: dict[str, Served]) -> None:
        self.spec = spec
        self.kinds = {key: pack.columns[key]["kind"] for key in spec}
        self.images = ImageCheck(pack)

    def __call__(self, pack: Pack, index: int) -> dict[str, Any]:
        sample: dict[str, Any] = {}
        for key, served in self.spec.items():
            kind = self.kinds[key]
            value = self.images.cell(pack, key, kind, index)
            if kind in ("image", "sequence") or served.base == "str":
                sample[key] = value
                continue
            stored = np.asarray(value)
            if served.checked:
                # An overflow becomes the PackError below, naming column and row.
                with np.errstate(over="ignore", invalid="ignore"):
                    out = stored.astype(served.dtype, copy=False)
                check_value(key, index, stored, out)
            else:
                out = stored.astype(served.dtype, copy=False)
            sample[key] = out
        return sample
