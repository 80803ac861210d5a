"""How each gauged metric is shown: Nebulae's four modes, checked once up front.

``format={key: (fmt, mode)}``:

- ``'raw'``: ``fmt`` is a format spec for the value (``'.4f'``, ``'8.3e'``);
- ``'percent'``: the value times 100 in ``fmt``, then ``%``;
- ``'tailor'``: ``fmt`` is a callable ``value -> str``;
- ``'inviz'``: ``fmt`` is a callable ``(stage, epoch, mile, mpe, value)``, called at each read
  (to save an image, say); nothing is shown.

Keys without a format are shown raw with ``'.4g'``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dualtrain.errors import bad_argument

__all__ = ["MODES", "Formats"]

MODES = ("raw", "percent", "tailor", "inviz")
_DEFAULT = (".4g", "raw")


class Formats:
    """A checked ``format`` mapping; `text` renders one value."""

    def __init__(self, specs: Mapping[str, Any] | None) -> None:
        self._specs: dict[str, tuple[Any, str]] = {}
        if specs is None:
            return
        if not isinstance(specs, Mapping):
            raise bad_argument("format", specs, "None or a dict {key: (fmt, mode)}")
        for key, spec in specs.items():
            name = f"format[{key!r}]"
            if not isinstance(spec, (tuple, list)) or len(spec) != 2:
                raise bad_argument(name, spec, f"a pair (fmt, mode), mode one of {MODES}")
            fmt, mode = spec
            if mode not in MODES:
                raise bad_argument(f"{name} mode", mode, "one of " + ", ".join(map(repr, MODES)))
            if mode in ("raw", "percent"):
                if not _spec_works(fmt):
                    raise bad_argument(f"{name} fmt", spec[0], "a format spec such as '.4f'")
            elif not callable(fmt):
                raise bad_argument(f"{name} fmt", fmt, f"a callable for mode {mode!r}")
            self._specs[str(key)] = (fmt, mode)

    def hidden(self, key: str) -> bool:
        """Whether `key` is 'inviz' (handed to its callable, never shown)."""
        return self._specs.get(key, _DEFAULT)[1] == "inviz"

    def text(self, key: str, value: float) -> str:
        """`value` as `key`'s format shows it ("" for 'inviz')."""
        fmt, mode = self._specs.get(key, _DEFAULT)
        if mode == "raw":
            return format(value, fmt)
        if mode == "percent":
            return format(value * 100, fmt) + "%"
        if mode == "tailor":
            return str(fmt(value))
        return ""

    def notify(self, key: str, stage: str, epoch: int, mile: int, mpe: int, value: float) -> None:
        """Calls an 'inviz' key's callable; other keys are shown, not notified."""
        fmt, mode = self._specs.get(key, _DEFAULT)
        if mode == "inviz":
            callback: Callable[..., Any] = fmt
            callback(stage, epoch, mile, mpe, value)


def _spec_works(fmt: Any) -> bool:
    if not isinstance(fmt, str):
        return False
    try:
        format(1.5, fmt)
    except (ValueError, TypeError):
        return False
    return True
