"""Names of the migrated tools that dualtrain does not carry over, and the error they raise.

A compat module lists such names with what to use instead; its module ``__getattr__``
raises `RetiredError` for them, so ``from ... import Name`` fails at the import with the
dualtrain way in the message (not with a bare "cannot import name").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn

from dualtrain.errors import DualtrainError

__all__ = ["RetiredError", "retire"]


class RetiredError(DualtrainError, ImportError):
    """A name of a migrated tool that dualtrain does not provide; the message says what to use.

    It is an ImportError, so ``from tool import Name`` fails where the name is imported.
    """


def retire(module: str, name: str, retired: Mapping[str, str]) -> NoReturn:
    """Raises for `name` looked up on `module`: RetiredError if retired, else AttributeError.

    Args:
        module: the module's ``__name__``.
        name: the attribute asked for.
        retired: retired name -> why, and what to use instead.
    """
    if name in retired:
        raise RetiredError(f"{module}.{name} is not provided: {retired[name]}", name=name)
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
