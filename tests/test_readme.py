"""The README's and guides' Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text())


@pytest.mark.parametrize("index", range(len(blocks(ROOT / "README.md"))))
def test_readme_quickstarts_run(index):
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    exec(compile(blocks(ROOT / "README.md")[index], f"README.md block {index}", "exec"), {})


@pytest.mark.parametrize(
    "guide",
    [
        "craft.md",
        "checkpoints.md",
        "fuel.md",
        "embeddings.md",
        "preload.md",
        "acceleration.md",
        "multiverse.md",
        "cockpit.md",
    ],
)
def test_guides_run_as_written(guide):
    """Each guide's Python blocks run in order, in one namespace, as a reader would."""
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    namespace: dict = {}
    for i, block in enumerate(blocks(ROOT / "docs" / guide)):
        if block.lstrip().startswith(("dualtrain.convert(tree", "TimeMachine(ckpt_path=None")):
            continue  # signatures, not code
        exec(compile(block, f"docs/{guide} block {i}", "exec"), namespace)


def test_readme_names_the_two_commands_first():
    text = (ROOT / "README.md").read_text()
    first_block = text.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert first_block[0].startswith("./dev demo") and first_block[1].startswith("./dev test")
    assert "./dev test" in (ROOT / ".ci" / "run").read_text()
