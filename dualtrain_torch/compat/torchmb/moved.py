"""torchmb names whose job dualtrain does another way: asking for one says which way.

A module lists such names with `moved_names`, which gives it a module ``__getattr__``:
``from ... import NAME`` and ``module.NAME`` both raise `MovedNameError` with the dualtrain
way in the message (an ImportError, so a ``try: from ... import`` fallback still works).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dualtrain.compat.retired import RetiredError

__all__ = ["MovedNameError", "moved_names"]

# Every compat namespace raises the one error for a name it does not carry over.
MovedNameError = RetiredError


def moved_names(module: str, ways: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` raising `MovedNameError` for the names in `ways`.

    Args:
        module: the module's ``__name__``, for the messages.
        ways: torchmb's name -> what to do instead, in a sentence.
    """
    ways = dict(ways)

    def __getattr__(name: str) -> object:  # noqa: N807 (the module hook's own name)
        if name in ways:
            raise MovedNameError(
                f"torchmb's {name} has no counterpart in {module}: {ways[name]}",
                name=name,
            )
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
