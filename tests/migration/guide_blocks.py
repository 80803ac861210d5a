"""Runs a guide's Python blocks as a migrating reader would: each block alone, in a fresh
namespace, from a fresh empty working directory (a block makes the files it reads).

``python tests/migration/guide_blocks.py FILE.md`` runs every block of FILE.md and says which
failed; the tests call `run_block` on docs/migration.md's blocks.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def blocks(path: Path) -> list[str]:
    """The ```python blocks of a Markdown file, in order."""
    return BLOCK.findall(path.read_text())


def run_block(code: str, name: str, workdir: Path) -> dict:
    """Executes `code` with `workdir` as the working directory; returns its namespace."""
    namespace: dict = {"__name__": "__migration__"}
    here = os.getcwd()
    os.chdir(workdir)
    try:
        exec(compile(code, name, "exec"), namespace)
    finally:
        os.chdir(here)
    return namespace


def main(path: str) -> int:
    failed = 0
    for i, code in enumerate(blocks(Path(path))):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                run_block(code, f"{path} block {i}", Path(tmp))
                print(f"block {i}: ok")
            except Exception as err:  # report every block, then fail
                failed += 1
                print(f"block {i}: FAILED {type(err).__name__}: {err}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
