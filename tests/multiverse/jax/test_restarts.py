"""Surviving a lost worker under JAX: the adapter's own spawner restarts, a stalled rank named.

jax.distributed has no agent that restarts processes (its coordination service notices a
missing heartbeat and fails the run), so the JAX adapter's agent (its spawner) spawns every
worker again, `max_restarts` times; the same laws as torch's hold.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dualtrain import Multiverse, WorkerError
from tests.multiverse.jax import restart_universes as ru

STEPS, EVERY, KILL_AT = 6, 2, 3


def test_a_worker_killed_mid_step_restarts_from_the_last_anchor_to_the_same_model(
    tmp_path: Path,
) -> None:
    (tmp_path / "whole").mkdir()
    (tmp_path / "killed").mkdir()
    options = {"backend": "jax", "processes": 2}
    whole = Multiverse(ru.resumes, 2, **options)(str(tmp_path / "whole"), STEPS, EVERY, None)
    resumed = Multiverse(ru.resumes, 2, max_restarts=1, **options)(
        str(tmp_path / "killed"), STEPS, EVERY, KILL_AT
    )
    assert (tmp_path / "killed" / "killed").exists()  # rank 1 did die, once
    assert (whole["restarts"], resumed["restarts"]) == (0, 1)
    assert resumed["start"] == KILL_AT - KILL_AT % EVERY  # from the last anchor before it
    # Exactly: the same compiled step on the same inputs, from the same bits.
    assert whole["params"].keys() == resumed["params"].keys()
    for name, value in whole["params"].items():
        np.testing.assert_array_equal(resumed["params"][name], value, err_msg=name)


def test_a_stalled_worker_is_named_by_its_own_rank(tmp_path: Path) -> None:
    # The message is the heartbeat's, naming rank 1: not jax.distributed's (100 s).
    with pytest.raises(WorkerError, match=r"rank 1 failed at step 2: no step for 5 s") as caught:
        Multiverse(ru.stalls, 2, backend="jax", processes=2, heartbeat=5)(str(tmp_path), 1)
    assert (caught.value.rank, caught.value.step) == (1, 2)
