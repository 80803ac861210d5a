"""The heartbeat's rule on a fake clock: which worker is stalled, and who is named.

`stalled` judges rows of (pid, steps, last step's time, state, attempt) at a given `now`;
no test here sleeps to decide anything. A real stalled worker is named in
tests/multiverse/{torch,jax}/test_restarts.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from dualtrain import ArgumentError, Multiverse
from dualtrain.multiverse.heartbeat import (
    DONE,
    RUNNING,
    STARTING,
    Beat,
    Beats,
    Watchdog,
    check_heartbeat,
    stalled,
)
from tests.multiverse import universes


def beat(rank: int, steps: int, when: float, state: int = RUNNING, attempt: int = 0) -> Beat:
    return Beat(rank, 1000 + rank, steps, when, state, attempt)


def test_a_worker_is_stalled_only_past_the_heartbeat() -> None:
    rows = [beat(0, 3, 100.0), beat(1, 3, 101.0)]
    assert stalled(rows, 110.0, 10.0) is None  # 10 s exactly is not past it
    assert stalled(rows, 110.5, 10.0) == rows[0]
    assert stalled(rows, 200.0, 10.0) == rows[0]  # both late, same steps: the older step


def test_the_worker_behind_is_named_not_the_peer_waiting_for_it() -> None:
    # rank 1 stopped after step 2; rank 0 counted step 3 and waits in its collective
    rows = [beat(0, 3, 50.0), beat(1, 2, 49.0), beat(2, 3, 50.0)]
    assert stalled(rows, 60.0, 5.0) == rows[1]
    # the peer's step is older than the stalled worker's: steps decide first
    rows = [beat(0, 3, 40.0), beat(1, 2, 45.0)]
    assert stalled(rows, 60.0, 5.0) == rows[1]


def test_a_step_counted_at_its_end_is_reached_as_it_begins() -> None:
    # A torch learner counts its step at its end: rank 0, blocked in step 3's all-reduce,
    # has counted 2 steps like rank 1, which stopped; rank 0 has begun step 3.
    rank0 = Beat(0, 1000, 2, 49.0, RUNNING, 0, begun=3)
    rank1 = Beat(1, 1001, 2, 50.0, RUNNING, 0, begun=2)  # its last step came later
    assert stalled([rank0, rank1], 60.0, 5.0) == rank1
    assert (rank0.reached, rank1.reached, beat(2, 4, 0.0).reached) == (3, 2, 4)


def test_finished_starting_and_earlier_attempts_are_not_judged() -> None:
    rows = [
        beat(0, 9, 0.0, state=DONE),  # returned: waits for the others at its exit
        beat(1, 0, 0.0, state=STARTING),  # no first step yet: joining is bounded by timeout
        Beat(2, 0, 0, 0.0, RUNNING, 0),  # no pid: not started
    ]
    assert stalled(rows, 1e6, 1.0) is None
    old, new = beat(0, 1, 0.0, attempt=0), beat(1, 4, 99.0, attempt=1)
    assert stalled([old, new], 100.0, 5.0) is None  # the dead attempt's row is stale, not late


rows_strategy = st.lists(
    st.tuples(
        st.integers(0, 5), st.floats(0, 100), st.sampled_from([STARTING, RUNNING, DONE]),
        st.integers(0, 2), st.integers(0, 6),
    ),
    min_size=1,
    max_size=6,
)  # fmt: skip


@given(rows_strategy, st.floats(0, 200), st.floats(0.1, 50))
def test_the_named_worker_is_late_and_no_late_worker_is_behind_it(
    spec: list[tuple[int, float, int, int, int]], now: float, heartbeat: float
) -> None:
    rows = [Beat(r, 1000 + r, s, t, state, a, b) for r, (s, t, state, a, b) in enumerate(spec)]
    latest = max(b.attempt for b in rows)
    late = [b for b in rows if b.attempt == latest and b.state == RUNNING
            and now - b.time > heartbeat]  # fmt: skip
    named = stalled(rows, now, heartbeat)
    assert (named is None) == (not late)
    if named is not None:
        assert named in late
        assert all(
            (named.reached, named.steps, named.time) <= (b.reached, b.steps, b.time) for b in late
        )


def test_the_watchdog_kills_the_stalled_worker_and_keeps_the_verdict(tmp_path: Path) -> None:
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        beats = Beats.create(tmp_path, 2)
        beats.start(0, attempt=0)  # this process stands in for rank 0, which keeps stepping
        beats.step(0, 5)
        row = beats._rows[1]  # rank 1: the child, started and stepped once, long ago
        row[:] = (worker.pid, 1, time.time() - 100, RUNNING, 0, 1)
        watchdog = Watchdog(beats, 30.0)
        assert watchdog.check(time.time()).rank == 1
        assert worker.wait(timeout=30) == -9  # SIGKILL
        assert "no step for 30 s (heartbeat=30) after step 1" in watchdog.what()
        assert watchdog.check(time.time() + 1000) is None  # that attempt is judged
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan"), True, "3"])
def test_a_bad_heartbeat_is_refused_naming_it(value: object) -> None:
    with pytest.raises(ArgumentError, match=r"^heartbeat must be None or a positive number"):
        check_heartbeat(value)
    with pytest.raises(ArgumentError, match=r"^heartbeat must be"):
        Multiverse(universes.where, 2, heartbeat=value)


@pytest.mark.parametrize("value", [-1, 1.5, True, None])
def test_a_bad_max_restarts_is_refused_naming_it(value: object) -> None:
    with pytest.raises(ArgumentError, match=r"^max_restarts must be an int >= 0"):
        Multiverse(universes.where, 2, max_restarts=value)


def _reported(folder: Path, rank: int, step: int, text: str) -> None:
    """Rank `rank`'s error report of attempt 0, as a worker writes it."""
    from dualtrain.multiverse.launch import FileReport, report_failure

    report_failure(FileReport(folder, 0, rank), step, RuntimeError(text))


def test_a_death_seen_no_later_than_a_peers_error_is_the_first_cause(tmp_path: Path) -> None:
    from dualtrain.multiverse.launch import failure_error

    # rank 1 was SIGKILLed; rank 0's collective then failed and it reported; the agent
    # noticed rank 0's exit first (its failures name rank 0 only).
    _reported(tmp_path, 0, 4, "Connection reset by peer")
    steps = {0: 4, 1: 3, 2: 5}.__getitem__
    err = failure_error(tmp_path, 0, 2, {0: 1}, steps, ended={1: (7, -9), 0: (7, 1)})
    assert (err.rank, err.step) == (1, 3) and "killed by SIGKILL" in str(err)
    assert "then rank(s) [0] failed too" in str(err)
    # a worker that ended after the first error was stopped by the launcher: not a cause
    err = failure_error(tmp_path, 0, 2, {0: 1}, steps, ended={0: (7, 1), 1: (9, -15)})
    assert (err.rank, err.step) == (0, 4) and "Connection reset by peer" in str(err)
    # of deaths alone, the first seen
    empty = tmp_path / "none"
    empty.mkdir()
    err = failure_error(empty, 0, 3, {2: -9}, steps, ended={2: (3, -9), 0: (5, -15)})
    assert err.rank == 2 and "killed by SIGKILL" in str(err)
    # a stalled worker named by the heartbeat comes first of all
    err = failure_error(tmp_path, 0, 2, {0: 1}, steps, (1, 3, "stalled"), {1: (2, -9)})
    assert (err.rank, str(err).split(": ", 1)[1]) == (1, "stalled (then rank(s) [0] failed too)")


def test_a_heartbeat_under_an_outside_launcher_is_said_not_watched(monkeypatch) -> None:
    """Under torchrun the launcher supervises: a heartbeat asked for is not silently dropped."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                        "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29999"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    with pytest.warns(UserWarning, match=r"heartbeat=3\.0\) is not watched under torchrun"):
        Multiverse(universes.where, 2, heartbeat=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Multiverse(universes.where, 2)  # no heartbeat asked: nothing said
