"""The structure rules of #32, read from the source with `ast` (import-linter holds the graph).

- no private name (``_x``) is imported from another module of the three packages: a helper
  two modules share is public within its package;
- no class mixes in two of the packages' own classes: a capability is composed of objects
  that each own their state, never one class spread over files;
- the neutral core never asks which framework it runs on: per-framework policy is data an
  adapter declares (its traits, its rung table, its strategies), so ``== "torch"`` and
  tables keyed by framework names live in the adapters. The registry that maps names to
  adapters, and checks that a user's name is one of them, are the exceptions (listed).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dualtrain", "dualtrain_torch", "dualtrain_jax")
FRAMEWORKS = {"torch", "jax"}

# Core modules allowed to name frameworks, and why.
REGISTRY = {
    "dualtrain/backends.py": "the registry: backend names -> adapter modules and type names",
    "dualtrain/backend_contract.py": "display names for messages",
    "dualtrain/preload/kinds.py": "recognises an item's tensors by their classes' modules, "
    "without importing a framework (what the byte count and the hit copies need to know)",
    "dualtrain/preload/pickling.py": "the same recognition, for the fast pickling of arrays",
}


def _modules(packages: tuple[str, ...] = PACKAGES) -> Iterator[tuple[str, ast.Module]]:
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def test_no_private_name_is_imported_across_modules():
    found = []
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.split(".")[0] not in PACKAGES:
                    continue
                found += [
                    f"{rel}:{node.lineno} {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_no_class_mixes_in_two_of_our_classes():
    """(compat/ is exempt: a seed tool's class keeps its own bases there, as its spec.)"""
    defined: dict[str, set[str]] = {}
    classes = []
    for rel, tree in _modules():
        if "compat" in rel.split("/"):
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, set()).add(rel)
                classes.append((rel, node))
    mixed = []
    for rel, node in classes:
        ours = [
            ast.unparse(b)
            for b in node.bases
            if ast.unparse(b).rpartition(".")[2] in defined and "Protocol" not in ast.unparse(b)
        ]
        if len(ours) > 1:
            mixed.append(f"{rel}:{node.lineno} class {node.name}({', '.join(ours)})")
    assert not mixed, "classes mixed from several of ours:\n" + "\n".join(mixed)


def _framework_branches(tree: ast.Module) -> Iterator[tuple[int, str]]:
    def named(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value in FRAMEWORKS

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops) and any(
                named(side) for side in sides
            ):
                yield node.lineno, ast.unparse(node)
            elif any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                for side in node.comparators:
                    elements = getattr(side, "elts", [])
                    names = {e.value for e in elements if named(e)}
                    # a check that a name is one of the frameworks, both listed, is validation
                    if names and names != FRAMEWORKS:
                        yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.Dict) and any(k is not None and named(k) for k in node.keys):
            yield node.lineno, "a table keyed by framework names"


def test_the_core_never_branches_on_a_framework_name():
    found = []
    for rel, tree in _modules(("dualtrain",)):
        parts = rel.split("/")
        if rel in REGISTRY or "demo" in parts or "compat" in parts:
            continue
        found += [f"{rel}:{line} {what}" for line, what in _framework_branches(tree)]
    assert not found, "framework-name branches in the core:\n" + "\n".join(found)


def test_the_rules_catch_what_they_name():
    """Each rule finds its own example, so a rule that reads nothing cannot pass."""
    branch = ast.parse("if backend == 'torch': pass\nT = {'jax': 1}\nok = name in ('torch', 'jax')")
    assert [line for line, _ in _framework_branches(branch)] == [1, 2]
    assert len(list(_modules())) > 200
