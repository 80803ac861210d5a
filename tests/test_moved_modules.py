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


def _old_names(framework: str) -> dict[str, str]:
    pytest.importorskip(framework)
    moves = {}
    for package in PACKAGES:
        for path in sorted((ROOT / f"dualtrain_{framework}" / package).glob("*.py")):
            if path.stem in OWN:
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
        with pytest.warns(DeprecationWarning, match=f"{old} is deprecated.*use {new}"):
            served = importlib.import_module(old)
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
