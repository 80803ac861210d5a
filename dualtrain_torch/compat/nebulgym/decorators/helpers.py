"""nebulgym's ``decorators.helpers``: run a function with its warnings or its output hidden."""

from __future__ import annotations

import contextlib
import functools
import io
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from dualtrain.errors import bad_argument

__all__ = ["suppress_stdout", "suppress_warnings"]

F = TypeVar("F", bound=Callable[..., Any])


def _check(target_func: Any) -> None:
    if not callable(target_func):
        raise bad_argument("target_func", target_func, "a function to wrap")


def suppress_warnings(target_func: F) -> F:
    """`target_func` running with every warning ignored (the caller's filters come back)."""
    _check(target_func)

    @functools.wraps(target_func)
    def run(*args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return target_func(*args, **kwargs)

    return run  # type: ignore[return-value]


def suppress_stdout(target_func: F) -> F:
    """`target_func` running with what it prints to ``sys.stdout`` dropped."""
    _check(target_func)

    @functools.wraps(target_func)
    def run(*args: Any, **kwargs: Any) -> Any:
        with contextlib.redirect_stdout(io.StringIO()):
            return target_func(*args, **kwargs)

    return run  # type: ignore[return-value]
