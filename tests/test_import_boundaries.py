"""Subprocess proofs of the import rules: the core finds frameworks, it never imports them."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap

import pytest

FRAMEWORKS = ("torch", "jax", "jaxlib", "optax", "cupy")

# A meta-path finder that makes a framework look uninstalled inside the subprocess.
HIDE = """
import sys
class _Hide:
    def __init__(self, names): self.names = names
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Hide({hidden!r}))
"""


def run(code: str, hidden: tuple[str, ...] = ()) -> str:
    prelude = HIDE.format(hidden=set(hidden)) if hidden else ""
    out = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_the_issue_one_liner():
    run("import dualtrain, sys; assert 'torch' not in sys.modules and 'jax' not in sys.modules")


def test_import_and_a_sweep_through_the_core_load_no_framework():
    stdout = run(
        """
        import sys
        import numpy as np
        import dualtrain
        from dualtrain import backends, cli, demo, errors, interop, memory, tree
        a = dualtrain.aligned_empty((4, 3), np.float32)
        with dualtrain.count_copies():
            b = dualtrain.convert({"a": a, "l": [a, 1]}, to="numpy", copy=True)
        dualtrain.backend_of(a)
        dualtrain.load("numpy").take_rows(a, np.array([0, 2]))
        dualtrain.available()
        tree.leaves(b)
        demo.make_data(0)
        try:
            cli.main(["--version"])
        except SystemExit:
            pass
        """
        + f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))"
    )
    assert stdout.strip().endswith("[]"), stdout


def test_the_torch_adapter_never_loads_jax():
    stdout = run(
        """
        import sys, numpy as np, dualtrain, dualtrain_torch
        t = dualtrain.convert(np.ones(3, np.float32), to="torch")
        back = dualtrain.convert(t, to="numpy")
        print(sorted(m for m in ("jax", "jaxlib", "optax") if m in sys.modules))
        """
    )
    assert stdout.strip().endswith("[]"), stdout


def test_the_jax_adapter_never_loads_torch():
    stdout = run(
        """
        import sys, numpy as np, dualtrain, dualtrain_jax
        j = dualtrain.convert(np.ones(3, np.float32), to="jax")
        back = dualtrain.convert(j, to="numpy")
        print("torch" in sys.modules)
        """
    )
    assert stdout.strip().endswith("False"), stdout


@pytest.mark.parametrize(("works", "hidden"), [("torch", "jax"), ("jax", "torch")])
def test_each_adapter_works_with_the_other_framework_missing(works, hidden):
    stdout = run(
        f"""
        import numpy as np, dualtrain
        x = dualtrain.convert(np.arange(4, dtype=np.float32), to={works!r})
        assert dualtrain.convert(x, to="numpy").tolist() == [0, 1, 2, 3]
        assert dualtrain.available() == ["numpy", {works!r}], dualtrain.available()
        try:
            dualtrain.convert(np.ones(2), to={hidden!r})
        except ImportError as err:
            print("hint:", err)
        """,
        hidden=(hidden,) if hidden != "jax" else ("jax", "jaxlib", "optax"),
    )
    assert f"pip install 'dualtrain[{hidden}]'" in stdout, stdout


def test_importing_every_jax_module_starts_no_backend():
    """jax.distributed.initialize must still be possible after the imports (Multiverse)."""
    stdout = run(
        """
        import pkgutil, importlib, dualtrain_jax
        for info in pkgutil.iter_modules(dualtrain_jax.__path__):
            importlib.import_module(f"dualtrain_jax.{info.name}")
        from jax._src import xla_bridge
        print(xla_bridge.backends_are_initialized())
        """
    )
    assert stdout.strip().endswith("False"), stdout


def test_import_dualtrain_loads_each_part_on_first_use():
    """`import dualtrain` loads its errors and version only; each public name loads its own
    part when first used, and every name in __all__ resolves (a sweep pays for no Tank)."""
    out = run(
        """
        import sys
        import dualtrain
        loaded = sorted(m for m in sys.modules if m.startswith("dualtrain"))
        assert loaded == ["dualtrain", "dualtrain.errors", "dualtrain.version"], loaded
        from dualtrain import Tank
        assert "dualtrain.fuel" in sys.modules and "dualtrain.multiverse" not in sys.modules
        assert dualtrain.atomic.sweep_stale and dualtrain.multiverse.Multiverse  # parts by name
        for name in dualtrain.__all__:
            assert getattr(dualtrain, name) is not None, name
        assert set(dualtrain.__all__) <= set(dir(dualtrain))
        try:
            dualtrain.not_a_name
        except AttributeError as error:
            print(error)
        """
    )
    assert "module 'dualtrain' has no attribute 'not_a_name'" in out


def test_the_preloaders_fork_hook_runs_before_the_lock_taking_ones():
    """Python runs fork hooks newest first. logging's and the thread pools' take a lock;
    registered after forks.py's (once `import dualtrain` stopped loading them up front),
    two loader threads forking at once deadlocked (tests/preload/torch/test_cache_processes).
    Here the lock-taking hooks must be registered before forks.py's, whatever loads first."""
    out = run(
        """
        import os, sys
        order = []
        real = os.register_at_fork
        def spy(**hooks):
            order.append(sys._getframe(1).f_globals.get("__name__"))
            real(**hooks)
        os.register_at_fork = spy
        for name in [m for m in sys.modules if m == "logging" or m.startswith("concurrent")]:
            del sys.modules[name]
        import dualtrain.preload.forks
        print(order)
        """
    )
    order = ast.literal_eval(out.strip().splitlines()[-1])
    forks = order.index("dualtrain.preload.forks")
    assert {"logging", "concurrent.futures.thread"} <= set(order[:forks]), order
