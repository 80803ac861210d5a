"""The README's and guides' Python examples run as written, in order, as a reader runs them.

Every block fenced as Python on a page runs in page order in one namespace, from an empty
folder that must still be empty afterwards: a block that needs a name from another page, or
makes a folder a second time, fails here as it would for a reader, and one that writes into
the reader's current folder fails too (examples write under tempfile.mkdtemp()).
Signatures and the seed tools' quoted code are fenced as ``text``. docs/migration.md has
its own harness (tests/migration/), which runs each of its blocks alone, as that page asks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
# Pages whose blocks run by another harness.
OWN_HARNESS = {"migration.md"}


def blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text())


def pages() -> list[str]:
    docs = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name not in OWN_HARNESS)
    return ["README.md"] + [f"docs/{name}" for name in docs if blocks(ROOT / "docs" / name)]


def run_page(page: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(folder)
    namespace: dict = {"__name__": "__main__"}
    for i, block in enumerate(blocks(ROOT / page)):
        exec(compile(block, f"{page} block {i}", "exec"), namespace)
    left = sorted(p.name for p in folder.iterdir())
    assert not left, f"{page} wrote {left} into the reader's current folder: use tempfile.mkdtemp()"


def test_every_page_with_python_blocks_is_run():
    """A new guide is picked up without editing this file; an empty list would hide that."""
    assert "README.md" in pages()
    assert len(pages()) >= 8


@pytest.mark.parametrize("page", pages())
def test_page_runs_in_order_from_an_empty_folder(page, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    run_page(page, tmp_path, monkeypatch)


def test_readme_names_the_two_commands_first():
    text = (ROOT / "README.md").read_text()
    first_block = text.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert first_block[0].startswith("./dev demo") and first_block[1].startswith("./dev test")
    assert "./dev test" in (ROOT / ".ci" / "run").read_text()
