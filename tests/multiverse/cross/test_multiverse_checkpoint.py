"""A checkpoint dropped while 2 torch workers train resumes in a 1-process JAX run.

Rank 0 writes the anchor (`mv.time_machine`) after two data-parallel steps; JAX loads it
into a fresh module, which predicts what torch's did then, and one JAX step on the whole
global batch lands where torch's third data-parallel step did.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dualtrain import Multiverse
from tests.multiverse import framework_universes as fu


def test_a_torch_two_worker_checkpoint_resumes_under_jax(tmp_path: Path) -> None:
    lr = 0.3
    torch_run = Multiverse(fu.torch_drops_mid_training, 2)(str(tmp_path), lr)
    anchors = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert anchors == [Path(torch_run["anchor"]).name]  # written once, by rank 0
    jax_run = Multiverse(fu.jax_resumes, 1, backend="jax")(torch_run["anchor"], lr)
    np.testing.assert_allclose(jax_run["at_anchor"], torch_run["at_anchor"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax_run["after"], torch_run["after"], rtol=1e-4, atol=1e-5)
    assert not np.allclose(torch_run["after"], torch_run["at_anchor"])  # the step moved it
