"""Deprecation paths: arguments that became keyword-only still work positionally for a release."""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["positional_deprecated"]

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
