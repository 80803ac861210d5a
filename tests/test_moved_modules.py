"""The adapters' modules that moved into capability subpackages (#32) still import by their old
names: the very module of the new path, after a DeprecationWarning naming it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("batching", "compilation", "distributed")
# the module that took the package's old flat module's place: its old name is the package's
OWN = {"module", "accelerated", "runtime", "__init__"}
RENAMED = {("jax", "compilation", "cache"): "dualtrain_jax.compile_cache"}
NEW = {  # no old name: made after the move
    ("torch", "compilation", "cache"),
    ("jax", "distributed", "exit"),
    ("torch", "distributed", "agent"),
    ("jax", "distributed", "agent"),
    ("torch", "distributed", "exchange"),
    ("jax", "distributed", "exchange"),
}


def _old_names(framework: str) -> dict[str, str]:
    pytest.importorskip(framework)
    moves = {}
    for package in PACKAGES:
        for path in sorted((ROOT / f"dualtrain_{framework}" / package).glob("*.py")):
            if path.stem in OWN or (framework, package, path.stem) in NEW:
                continue
            new = f"dualtrain_{framework}.{package}.{path.stem}"
            old = RENAMED.get(
                (framework, package, path.stem), f"dualtrain_{framework}.{package}_{path.stem}"
            )
            moves[old] = new
    return moves


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_every_moved_module_imports_by_its_old_name_with_a_warning(framework):
    moves = _old_names(framework)
    assert len(moves) >= 12
    for old, new in moves.items():
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=f"{old} is deprecated.*use {new}") as seen:
            __import__(old)  # the import statement's own frame is this test's
        served = sys.modules[old]
        assert [w.filename for w in seen] == [__file__], old  # shown where the import is
        assert served is importlib.import_module(new), old
        assert served.__spec__.name == new, old  # the new module keeps its own spec
        sys.modules.pop(old, None)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_the_old_flat_modules_names_are_the_packages_with_their_old_exports(framework):
    pytest.importorskip(framework)
    old_exports = {
        "batching": ["BatchModule", "batch_loss", "batch_topk"],
        "compilation": ["accelerate", "accelerate_model"],
        "distributed": ["join"],
    }
    for package, names in old_exports.items():
        module = importlib.import_module(f"dualtrain_{framework}.{package}")
        for name in names:
            assert callable(getattr(module, name)), (package, name)


HOMES = {"batching": "module", "compilation": "accelerated", "distributed": "runtime"}


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_the_old_flat_modules_other_names_are_served_with_a_warning(framework):
    """What the old flat module held beyond its __all__ is still found at its old path."""
    pytest.importorskip(framework)
    for package, home in HOMES.items():
        old = importlib.import_module(f"dualtrain_{framework}.{package}")
        new = importlib.import_module(f"dualtrain_{framework}.{package}.{home}")
        submodules = {p.stem for p in (ROOT / f"dualtrain_{framework}" / package).glob("*.py")}
        names = [
            name
            for name, value in vars(new).items()
            if not name.startswith("__")
            and name not in submodules
            and name not in vars(old)
            and name not in old.__all__  # the package's own names, some loaded on first use
            and not isinstance(value, type(sys))
        ]
        assert names, package
        for name in names:
            with pytest.warns(DeprecationWarning, match=f"use {new.__name__}.{name}"):
                assert getattr(old, name) is getattr(new, name), (package, name)
        for stem in submodules - {"__init__"}:  # a submodule's name still imports it
            assert importlib.import_module(f"{old.__name__}.{stem}").__name__.endswith(stem)
        with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
            old.not_a_name  # noqa: B018


def test_a_capability_package_loads_nothing_until_a_name_is_used():
    """Importing `batching`, `compilation` or `distributed` (or one module in them, e.g.
    `batching.optim`) loads no other module of the package, and no framework: a probe for a
    name the old module never had imports nothing either."""
    import subprocess

    code = """
import sys
import dualtrain_jax.batching, dualtrain_jax.compilation, dualtrain_jax.distributed
import dualtrain_torch.batching, dualtrain_torch.compilation, dualtrain_torch.distributed
for package in (dualtrain_jax.distributed, dualtrain_torch.compilation):
    assert not hasattr(package, "_repr_html_") and not hasattr(package, "not_a_name")
assert "jax" not in sys.modules and "torch" not in sys.modules, "a framework was imported"
import dualtrain_torch.batching.optim
loaded = sorted(m for m in sys.modules if m.startswith("dualtrain_torch.batching."))
assert loaded == ["dualtrain_torch.batching.optim"], loaded
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
