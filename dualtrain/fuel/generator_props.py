"""A FuelGenerator's properties: how they are given, and their checks.

They come by position, by keyword or as a config dict, and are checked before the
generator takes any of them.

`generate_args` checks `generate`'s arguments and image settings; this module checks what
names the raw data: ``file_dir``, ``file_list``, ``dtype``, ``is_seq`` and the CSV dialect.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.fuel.columns import ColumnType

__all__ = ["PROPERTIES", "bind_properties", "check_properties"]

# In Nebulae's positional order (file_dir, file_list, dtype, is_seq), then dualtrain's own.
PROPERTIES = (
    "file_dir", "file_list", "dtype", "is_seq", "delimiter", "quotechar", "allow_outside",
)  # fmt: skip
_DEFAULTS = {"is_seq": False, "delimiter": ",", "quotechar": '"', "allow_outside": False}


def bind_properties(
    args: tuple[Any, ...], config: Mapping[str, Any] | None, keywords: Mapping[str, Any]
) -> dict[str, Any]:
    """The properties given to ``FuelGenerator(*args, config=..., **keywords)``.

    A lone positional dict (or None) is the config, as in dualtrain's first form and
    Nebulae's own code; other positional arguments take `PROPERTIES` in order. Keywords of
    value None count as not given.

    Raises:
        ArgumentError: config together with properties (naming both), a property given by
            position and by keyword, or too many positional arguments.
    """
    keywords = {k: v for k, v in keywords.items() if v is not None}
    if len(args) == 1 and (args[0] is None or isinstance(args[0], Mapping)):
        if config is not None and args[0] is not None:
            raise ArgumentError("config given twice: by position and as config=")
        config, args = config if args[0] is None else args[0], ()
    if len(args) > len(PROPERTIES):
        raise ArgumentError(
            f"FuelGenerator takes at most {len(PROPERTIES)} positional arguments "
            f"{PROPERTIES}; got {len(args)}"
        )
    positional = dict(zip(PROPERTIES, args, strict=False))
    twice = [k for k in positional if k in keywords]
    if twice:
        raise ArgumentError(f"FuelGenerator got {twice} both by position and by keyword")
    given = {**positional, **keywords}
    if config is None:
        return given
    if not isinstance(config, Mapping):
        raise bad_argument("config", config, "a dict of properties")
    if given:
        raise ArgumentError(
            f"config and the arguments {sorted(given)} are mutually exclusive: give every "
            f"property in config, or none there; got config with keys {sorted(config)} and "
            f"{sorted(given)} as arguments"
        )
    return dict(config)


def check_properties(old: Mapping[str, Any], updates: Mapping[str, Any]) -> dict[str, Any]:
    """The properties `old` after `updates`, every one checked; nothing is changed.

    A `file_list` that is not a file is looked for inside `file_dir`.
    """
    props = {**old, **updates}
    for key, default in _DEFAULTS.items():
        props.setdefault(key, default)
    for key in ("is_seq", "allow_outside"):
        if not isinstance(props[key], bool):
            raise bad_argument(key, props[key], "True or False")
    for key in ("delimiter", "quotechar"):
        if not isinstance(props[key], str) or len(props[key]) != 1:
            raise bad_argument(key, props[key], "a one-character str")
    for key in ("file_dir", "file_list", "dtype"):
        if props.get(key) is None:
            raise bad_argument(key, props.get(key), "given (in config or as a keyword)")
    dtype = props["dtype"]
    if isinstance(dtype, str) or not isinstance(dtype, (Mapping, Sequence)):
        raise bad_argument("dtype", dtype, "a list of column types or a dict key -> type")
    named = dtype.items() if isinstance(dtype, Mapping) else enumerate(dtype)
    for column, name in named:
        ColumnType.parse(name, f"dtype[{column!r}]")  # the header is checked in generate
    props["file_dir"] = _path("file_dir", props["file_dir"])
    props["file_list"] = _path("file_list", props["file_list"])
    if not os.path.isdir(props["file_dir"]):
        raise bad_argument("file_dir", props["file_dir"], "an existing folder")
    if not props["file_list"].lower().endswith(".csv"):
        raise bad_argument("file_list", props["file_list"], "a path to a .csv file")
    if not os.path.isfile(props["file_list"]):
        joined = os.path.join(props["file_dir"], props["file_list"])
        if not os.path.isfile(joined):
            raise bad_argument("file_list", props["file_list"], "an existing CSV file")
        props["file_list"] = joined
    return props


def _path(name: str, value: Any) -> str:
    """A path argument as a str (os.PathLike taken)."""
    if not isinstance(value, (str, os.PathLike)):
        raise bad_argument(name, value, "a path (a str or an os.PathLike)")
    return os.fspath(value)
