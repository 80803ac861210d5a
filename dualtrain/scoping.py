"""A context variable set for the length of a ``with`` block, then put back."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TypeVar

__all__ = ["scoped"]

T = TypeVar("T")


@contextlib.contextmanager
def scoped(var: contextvars.ContextVar[T], value: T) -> Iterator[None]:
    """Sets `var` to `value` inside the block, restoring what it was after.

    Restored by token, so nested blocks and other threads' or tasks' contexts are left as
    they were, also when the block raises.
    """
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)
