"""Deprecation paths: old spellings keep working for one release, with a warning naming the new.

`positional_deprecated`: arguments that became keyword-only still work positionally.
`moved`: a name (or module) that left its old path warns where it is reached that way.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["SEED_SPELLINGS", "moved", "moved_attribute", "positional_deprecated"]

F = TypeVar("F", bound=Callable[..., Any])


def positional_deprecated(public: str, old_order: tuple[str, ...]) -> Callable[[F], F]:
    """Lets a function whose trailing arguments became keyword-only take them positionally.

    Positional values beyond the function's own positional parameters are mapped to names
    by `old_order` (the order the previous release took them in, which may differ between
    adapters) with a ``DeprecationWarning`` that shows the keyword form. The wrapped
    function keeps its keyword-only signature for ``inspect.signature``.

    Args:
        public: the name users call it by, for the messages (``"dualtrain_torch.realize"``).
        old_order: the names the extra positional values stood for, in the old order.
    """

    def wrap(fn: F) -> F:
        params = inspect.signature(fn).parameters.values()
        npos = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)

        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            extra = args[npos:]
            if extra:
                if len(extra) > len(old_order):
                    raise TypeError(
                        f"{public}() takes at most {npos + len(old_order)} positional "
                        f"arguments ({len(args)} given); pass the rest by keyword"
                    )
                named = dict(zip(old_order, extra, strict=False))
                twice = sorted(set(named) & set(kwargs))
                if twice:
                    raise TypeError(f"{public}() got multiple values for {', '.join(twice)}")
                form = ", ".join(f"{k}={v!r}" for k, v in named.items())
                warnings.warn(
                    f"passing {', '.join(named)} to {public} by position is deprecated and "
                    f"will be refused in the next release; write {public}(..., {form})",
                    DeprecationWarning,
                    stacklevel=2,
                )
                kwargs.update(named)
            return fn(*args[:npos], **kwargs)

        return inner  # type: ignore[return-value]

    return wrap


def moved(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warns (DeprecationWarning) that `old` is reached by a deprecated path; `new` says where.

    `stacklevel` 3 points at the code that used the old path when this is called from a
    module ``__getattr__`` or a property.
    """
    warnings.warn(
        f"{old} is deprecated and goes in the next release: use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


# The seed tools' spellings that left the main packages (#31): name -> (the module that still
# defines it, its name there, what to use now). Each old home's __getattr__ serves its own.
SEED_SPELLINGS: dict[str, tuple[str, str, str]] = {
    "autoPad": (
        "dualtrain.craft.padding",
        "autoPad",
        "dualtrain.autopad (per-axis (low, high) pairs), or "
        "dualtrain.compat.nebulae.toolkit.autoPad (Nebulae's flat list)",
    ),
    "Craft": (
        "dualtrain.craft.craft",
        "Craft",
        "dualtrain.Craft (or dualtrain.compat.nebulae.astrobase.dock.Craft, Nebulae's Craft "
        "that realizes itself)",
    ),
    "NebulDataset": (
        "dualtrain.preload.preloader",
        "NebulDataset",
        "dualtrain.Preloader, or "
        "dualtrain_torch.compat.nebulgym.data.nebuly_dataset.NebulDataset (nebulgym's)",
    ),
    "patch_dataset": (
        "dualtrain.preload.decorators",
        "patch_dataset",
        "dualtrain.accelerate_dataset, or "
        "dualtrain_torch.compat.nebulgym.annotations.torch_annotations.patch_dataset (nebulgym's)",
    ),
    "patch_torch_module": (
        "dualtrain_torch.compilation",
        "patch_torch_module",
        "dualtrain_torch.accelerate_model, or dualtrain_torch.compat.nebulgym.annotations."
        "torch_annotations.patch_torch_module (nebulgym's)",
    ),
}


def moved_attribute(module: str, name: str, names: tuple[str, ...]) -> Any:
    """What a module ``__getattr__`` returns for a seed spelling that moved, with its warning.

    Args:
        module: the module's ``__name__``.
        name: the attribute asked for.
        names: the `SEED_SPELLINGS` this module used to export.

    Raises:
        AttributeError: `name` is not one of `names`.
    """
    if name not in names:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    home, attribute, new = SEED_SPELLINGS[name]
    moved(f"{module}.{name}", new, stacklevel=4)
    return getattr(importlib.import_module(home), attribute)
