"""The world-size law of embedding anchors, shared by the torch and JAX tests.

1. One process (this one, unsharded) trains to the drop and writes a single-file anchor.
2. Two processes load it (1 -> 2), write a sharded set at once, and train on.
3. Three processes load the set (2 -> 3) and train on; so does this process (2 -> 1).

Every load holds exactly the store at the drop, and every run ends where the
uninterrupted one did (float sums in another order: to rounding).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dualtrain import Multiverse
from dualtrain.checkpoint.embedding_sets import part_files
from tests.checkpoint import sharded_runs as runs


def same(got: dict[str, Any], want: dict[str, Any], exact: bool) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if exact or key in ("step", "counters"):
            np.testing.assert_array_equal(got[key], value, err_msg=key)
        else:
            np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


def check_law(fw: str, mode: str, folder: Path, kw: dict[str, Any]) -> None:
    where = str(folder)
    one = runs.resume(None, fw, mode, where, None, "one")
    extra = {"processes": 2} if fw == "jax" else {}
    two = Multiverse(runs.resume, 2, **kw, **extra)(fw, mode, where, "one", "two")
    assert len(part_files(folder / "two.safetensors")) == 2  # a part a rank
    same(two["at_drop"], one["at_drop"], exact=True)  # 1 -> 2
    same(two["final"], one["final"], exact=False)
    extra = {"processes": 3} if fw == "jax" else {}
    three = Multiverse(runs.resume, 3, **kw, **extra)(fw, mode, where, "two", None)
    same(three["at_drop"], one["at_drop"], exact=True)  # 2 -> 3
    same(three["final"], one["final"], exact=False)
    alone = runs.resume(None, fw, mode, where, "two", None)
    same(alone["at_drop"], one["at_drop"], exact=True)  # 2 -> 1
    same(alone["final"], one["final"], exact=False)
    assert not np.allclose(one["final"]["weight"], one["at_drop"]["weight"])  # it trained on
