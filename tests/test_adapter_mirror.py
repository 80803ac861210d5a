"""The two adapters mirror each other file for file (Keras 3's backend folders).

A capability arrives as one core contract plus one module of the same name in each adapter;
the only files one adapter has alone are listed here, each with the reason.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# file -> why only torch has it
TORCH_ONLY = {
    "compat": "migration shims for torch-only tools (SpeedTorch, torchmb): their APIs are torch's",
    "batching/stacked.py": (
        "model batching's layer-by-layer strategy: torch.func.vmap costs Python per layer and "
        "call, jax.vmap under jit does not (docs/batching.md, 'Why \"stacked\"')"
    ),
}
JAX_ONLY: dict[str, str] = {}


def _entries(package: str, below: str = "") -> set[str]:
    """The modules and subpackages of `package`, as paths relative to it; a subpackage's own
    entries are listed too, except under ``compat`` (a namespace of its own, TORCH_ONLY)."""
    folder = ROOT / package / below
    found = set()
    for p in folder.iterdir():
        name = f"{below}/{p.name}" if below else p.name
        if p.suffix == ".py":
            found.add(name)
        elif p.is_dir() and (p / "__init__.py").exists():
            found.add(name)
            if name != "compat":
                found |= _entries(package, name)
    return found


def test_the_adapters_mirror_file_for_file():
    torch_side, jax_side = _entries("dualtrain_torch"), _entries("dualtrain_jax")
    assert torch_side - jax_side == set(TORCH_ONLY), "a torch module without its JAX twin"
    assert jax_side - torch_side == set(JAX_ONLY), "a JAX module without its torch twin"


def test_every_listed_exception_still_exists():
    for name in TORCH_ONLY:
        assert (ROOT / "dualtrain_torch" / name).exists(), name
    for name in JAX_ONLY:
        assert (ROOT / "dualtrain_jax" / name).exists(), name
