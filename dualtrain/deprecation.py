"""Deprecation paths: old spellings keep working for one release, with a warning naming the new.

`positional_deprecated`: arguments that became keyword-only still work positionally.
`moved`: a name (or module) that left its old path warns where it is reached that way.
`moved_modules`: modules that moved inside a package still import by their old dotted names.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import types
import warnings
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

__all__ = [
    "SEED_SPELLINGS",
    "moved",
    "moved_attribute",
    "seed_spellings",
    "moved_modules",
    "moved_names",
    "positional_deprecated",
]

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


class _MovedModules:
    """Finds each old module name of `moves` and serves the module now at its new name.

    ``import old`` and ``from old import x`` give the very module object of the new path (its
    private names, and what a test patches on it, included), after a DeprecationWarning.
    """

    def __init__(self, moves: Mapping[str, str]) -> None:
        self.moves = dict(moves)
        self._specs: dict[str, Any] = {}  # old name -> the new module's own spec

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.moves:
            return None
        import importlib.util  # only when an old name is imported

        # a loader by its two methods: subclassing importlib.abc's costs each import 20 ms
        return importlib.util.spec_from_loader(fullname, self)  # type: ignore[arg-type]

    def create_module(self, spec: Any) -> types.ModuleType:
        new = self.moves[spec.name]
        # moved -> this method -> the import statement: warnings skips the import system's
        # own frames between them
        moved(spec.name, new, stacklevel=3)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__  # the import system sets the old one on it
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__spec__ is not None:  # the old spec, set by the import system
            module.__spec__ = self._specs.pop(module.__spec__.name)  # put its own back


def moved_modules(moves: Mapping[str, str]) -> None:
    """Lets each old dotted module name of `moves` (old -> new) import the module at its new one.

    Called by a package's ``__init__`` for the modules that moved inside it (#32), so the
    old name is found whenever the package is imported; each first import warns.
    """
    if not any(isinstance(f, _MovedModules) and f.moves == dict(moves) for f in sys.meta_path):
        sys.meta_path.append(_MovedModules(moves))


def moved_names(package: str, home: str, *, current: Collection[str] = ()) -> Callable[[str], Any]:
    """The ``__getattr__`` of a package that took the place of a flat module, now `home`.

    The package exports what the module exported (its ``__all__``, in `current`), loading
    `home` (and its framework) on first use of one of them. The rest of the module's names
    (helpers, constants, private names) are served at the old path, each use with a
    DeprecationWarning naming `home`. Which names `home` has is read from its source, so
    asking for one it lacks imports nothing; a submodule's name is left to the import
    system.
    """
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:  # noqa: N807 - the PEP 562 hook's own name
        if name in current:
            namespace[name] = value = getattr(importlib.import_module(home), name)
            return value  # later look-ups skip this function
        if name in _top_level_names(home) and not name.startswith("__"):
            from importlib.util import find_spec

            if find_spec(f"{package}.{name}") is None:
                moved(f"{package}.{name}", f"{home}.{name}")
                return getattr(importlib.import_module(home), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


@functools.cache
def _top_level_names(module: str) -> frozenset[str]:
    """The names `module` binds at its top level, read from its source (not imported)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return frozenset()
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names: set[str] = set()
    body = list(tree.body)
    while body:  # the module's statements, and those under its if / try blocks
        node = body.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try)):
            body += node.body + node.orelse + getattr(node, "finalbody", [])
            body += [s for h in getattr(node, "handlers", []) for s in h.body]
    return frozenset(names)


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
        "dualtrain_torch.compilation.accelerated",
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


def seed_spellings(module: str, names: tuple[str, ...]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving `names` (its moved `SEED_SPELLINGS`) with a warning.

    ``__getattr__ = seed_spellings(__name__, ("Craft",))`` in the module that exported them.
    """

    def __getattr__(name: str) -> Any:  # noqa: N807 - it becomes the module's own __getattr__
        return moved_attribute(module, name, names)

    return __getattr__
