"""Nebulae's ``nebulae.fuel.Generator``: dualtrain's FuelGenerator in Nebulae's argument order."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dualtrain.errors import ArgumentError
from dualtrain.fuel.generator import FuelGenerator

__all__ = ["Generator"]


class Generator(FuelGenerator):
    """``Generator(config=None, file_dir=None, file_list=None, dtype=None, is_seq=False)``.

    Nebulae's code takes a config dict first and the properties after it; dualtrain's
    `FuelGenerator` takes them first. Everything else (``generate``, ``modify``) is
    FuelGenerator's.
    """

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        file_dir: str | os.PathLike[str] | None = None,
        file_list: str | os.PathLike[str] | None = None,
        dtype: Any = None,
        is_seq: bool = False,
    ) -> None:
        given = [n for n, v in (("file_dir", file_dir), ("file_list", file_list), ("dtype", dtype))
                 if v is not None]  # fmt: skip
        if config is not None:
            if given:
                raise ArgumentError(
                    f"config and {', '.join(given)} both give the properties; give one"
                )
            super().__init__(config)
        else:
            super().__init__(file_dir, file_list, dtype, is_seq)  # type: ignore[arg-type]
