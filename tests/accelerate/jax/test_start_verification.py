"""A JAX job starts on ``jax.jit`` and verifies it against op-by-op JAX beside the job (#29).

The op-by-op reference of a CNN's training step takes seconds (a small XLA program per
operation): run before the job, it cost a 90-step job half its speed. It now runs in a
thread while ``jax.jit`` serves (what a user's ``jax.jit`` by hand serves); a start that
differs hands the job to op-by-op JAX at the next call and says so on stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from dualtrain_jax import accelerate  # noqa: E402
from dualtrain_jax.compilation import AcceleratedFunction  # noqa: E402

QUIET = {"cache": False, "warm_steps": 1}


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(shift=st.floats(1e-2, 10.0), rows=st.integers(1, 4))
def test_a_jit_start_that_differs_from_op_by_op_is_replaced_at_the_next_call(shift, rows, capfd):
    capfd.readouterr()  # one fixture for every example: start from nothing
    """Traced, this function adds `shift`: jit differs from op by op; eager takes over."""

    def sly(x):
        return x + shift if isinstance(x, jax.core.Tracer) else x

    fast = accelerate(sly, **QUIET)
    assert isinstance(fast, AcceleratedFunction)
    x = jnp.ones((rows, 3))
    first = np.asarray(fast(x))  # served by jit, as jax.jit(sly) by hand would
    np.testing.assert_allclose(first, np.ones((rows, 3)) + shift, rtol=1e-6)
    runner = fast._decider.known("call", fast.explain().decisions[0].signature)
    assert runner.verifying is not None and runner.verifying.wait(60)
    np.testing.assert_array_equal(np.asarray(fast(x)), np.ones((rows, 3)))  # eager's
    decision = fast.explain().decisions[0]
    assert decision.chosen == "EAGER"
    assert "differs from eager" in {a.rung: a.reason for a in decision.attempts}["JIT"]
    assert "eager serves from now on" in capfd.readouterr().err


def test_a_verified_start_is_cached_and_a_second_run_skips_op_by_op(tmp_path):
    calls = []

    def step(w, x):
        calls.append("traced or op by op")
        return w - 0.1 * jnp.tanh(x.T @ x) * w, jnp.sum(x)

    w, x = jnp.ones((3, 3)), jnp.arange(6.0).reshape(2, 3)
    fast = accelerate(step, cache=tmp_path, warm_steps=1)
    fast(w, x)
    runner = fast._decider.known("call", fast.explain().decisions[0].signature)
    assert runner.verifying.wait(60)
    fast(w, x)  # reads the verdict: verified, cached with JIT_DONATE waiting
    decision = fast.explain().decisions[0]
    assert decision.chosen == "JIT" and "verified against eager" in decision.attempts[0].reason
    calls.clear()
    again = accelerate(step, cache=tmp_path, warm_steps=1)
    np.testing.assert_allclose(np.asarray(again(w, x)[0]), np.asarray(fast(w, x)[0]))
    assert calls == ["traced or op by op"]  # one trace by jit; no op-by-op run
    assert again.explain().decisions[0].from_cache
    served = again._decider.known("call", again.explain().decisions[0].signature)
    assert getattr(served, "verifying", None) is None  # nothing verifying beside the job


def test_a_verified_start_is_cached_even_when_the_job_ends_before_reading_the_verdict(tmp_path):
    def step(w, x):
        return w - 0.1 * jnp.tanh(x.T @ x) * w, jnp.sum(x)

    w, x = jnp.ones((3, 3)), jnp.arange(6.0).reshape(2, 3)
    fast = accelerate(step, cache=tmp_path, warm_steps=1)
    fast(w, x)  # the only call: the verdict is never read by a call
    runner = fast._decider.known("call", fast.explain().decisions[0].signature)
    assert runner.verifying.wait(60)
    again = accelerate(step, cache=tmp_path, warm_steps=1)
    again(w, x)
    decision = again.explain().decisions[0]
    assert decision.from_cache and decision.chosen == "JIT"
    assert "verified against eager beside the job" in decision.attempts[0].reason


def test_an_exit_while_op_by_op_still_verifies_is_clean(tmp_path):
    """The interpreter exits with a verification thread inside JAX: it is stopped at a
    Python instruction first (a thread torn down inside a C++ call aborts a process)."""
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp
        from dualtrain.accelerate import verification
        from dualtrain_jax import accelerate

        def slow(x):  # one loop under jit; 10^6 operations op by op
            return jax.lax.fori_loop(0, 300000, lambda i, v: v * 1.0001 + 0.1, x)

        fast = accelerate(slow, cache=False)
        print(float(fast(jnp.ones(3))[0]), len(verification._verifying), flush=True)
        """
    )
    exits_quietly_while_verifying(script, tmp_path, runs=3)


def test_an_exit_parks_a_verification_whose_code_swallows_every_stop(tmp_path):
    """A retry loop around the work swallows every stop: after PARK_AFTER_S the thread is
    parked where the next stop lands (a Python check point), not left to run into the
    interpreter's finalization inside native code (an abort, "terminate called")."""
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp
        from dualtrain.accelerate import verification
        from dualtrain_jax import accelerate

        def slow(x):
            while True:  # op by op, a stop restarts the loop; under jit it returns at once
                try:
                    return jax.lax.fori_loop(0, 300000, lambda i, v: v * 1.0001 + 0.1, x)
                except BaseException:
                    pass

        fast = accelerate(slow, cache=False)
        print(float(fast(jnp.ones(3))[0]), len(verification._verifying), flush=True)
        """
    )
    exits_quietly_while_verifying(script, tmp_path, runs=2)


def test_an_exit_never_parks_a_verification_inside_a_lock_holding_logging_handler(tmp_path):
    """The user's retry loop logs each attempt: a stop landing inside the handler (its lock
    held) must not park the thread there, or logging.shutdown at exit waits for ever. It
    parks in the user's own code, or is left after the deadline; the process exits."""
    script = textwrap.dedent(
        f"""
        import logging, time
        from dualtrain.accelerate.options import LadderOptions
        from dualtrain.accelerate.verification import Verification

        log = logging.getLogger("user")
        log.addHandler(logging.FileHandler({str(tmp_path / "user.log")!r}))

        class Reference:  # the user's function op by op, in a retry loop that logs
            def check(self):
                while True:
                    try:
                        log.warning("attempt %s", list(range(50)))
                        sum(i * i for i in range(200))
                    except BaseException:
                        pass

        Verification(Reference(), [], [], LadderOptions()).start()
        time.sleep(0.3)
        print("done", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr


def exits_quietly_while_verifying(script: str, tmp_path: Path, runs: int) -> None:
    """`script` (printing its result and the live verifications) exits 0, stopped quietly."""
    env = {**os.environ, "DUALTRAIN_CACHE_DIR": str(tmp_path)}
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
        )
        assert done.returncode == 0, done.stderr
        value, live = done.stdout.split()
        assert float(value) > 1.0 and live == "1"  # it was still verifying at exit
        for sign in ("terminate", "Fatal", "Exception", "Traceback"):
            assert sign not in done.stderr, done.stderr  # stopped quietly


def test_an_exit_stops_a_verification_whose_code_swallows_the_first_stops(tmp_path):
    """A stop landing in a broad ``except`` of the user's or a library's code is swallowed;
    one stop and a wait let the thread run into finalization, which aborted the process
    (SIGABRT, "terminate called"): the stop is sent again until the thread has left."""
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp
        from dualtrain.accelerate import verification
        from dualtrain_jax import accelerate

        def body(i, v):
            try:  # most of op by op's time is spent here
                return v * 1.0001 + 0.1
            except BaseException:
                return v

        def slow(x):
            return jax.lax.fori_loop(0, 300000, body, x)

        fast = accelerate(slow, cache=False)
        print(float(fast(jnp.ones(3))[0]), len(verification._verifying), flush=True)
        """
    )
    exits_quietly_while_verifying(script, tmp_path, runs=2)
