"""kill -9 during `drop`: the previous anchors still load, no partial file sits under a final
name, and the next write to the folder removes the dead writer's temporary files."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dualtrain import TimeMachine, atomic

tcraft = pytest.importorskip("dualtrain_torch.craft")
from tests.checkpoint.crafts import Net  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HIDDEN = 100_000  # about 4 MB an anchor: a write lasts long enough to be caught in it

# One process pays torch's import once, then forks a writer per round; the test SIGKILLs the
# writer (its pid is what its temporary files carry). One torch thread, so forking is safe.
WRITER = textwrap.dedent(
    f"""
    import os, sys
    import torch
    torch.set_num_threads(1)
    from dualtrain import TimeMachine
    from dualtrain_torch.craft import realize
    from tests.checkpoint.crafts import Net
    module = realize(Net(hidden={HIDDEN}))
    tm = TimeMachine(save_path=sys.argv[1], max_anchors=2)
    step = 0
    for _ in sys.stdin:
        step += 1000
        pid = os.fork()
        if pid == 0:
            while True:
                step += 1
                with torch.no_grad():
                    module.fc1.bias.fill_(step)
                tm.drop(module, "named", step=step)
                tm.drop(module, step=step)
                print("dropped", flush=True)
        print(pid, flush=True)
        os.waitpid(pid, 0)
    """
)


def gone(pid: int, timeout: float = 60.0) -> None:
    """Waits until the killed writer is reaped by its parent (the fork server): at once on
    an idle machine, later on a busy one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)
    raise AssertionError(f"writer {pid} still runs {timeout} s after SIGKILL")


def one_round(writer, tmp_path, target, rng) -> int:
    """Starts a writer, kills it mid-way, checks the folder; returns temp files swept."""
    writer.stdin.write("go\n")
    writer.stdin.flush()
    line = writer.stdout.readline().strip()
    while line == "dropped":  # what the previous writer said before it was killed
        line = writer.stdout.readline().strip()
    pid = int(line)
    try:
        assert writer.stdout.readline().strip() == "dropped"  # one whole round on disk
        time.sleep(rng.uniform(0.0, 0.1))
    finally:
        os.kill(pid, signal.SIGKILL)
    gone(pid)
    temps = [p for p in tmp_path.iterdir() if atomic.is_temp(p)]
    assert all(atomic.writer_of(p)[1] == pid for p in temps)
    finals = sorted(p for p in tmp_path.iterdir() if not atomic.is_temp(p))
    assert finals and all(p.name.endswith(".safetensors") for p in finals)
    for path in finals:  # every file under a final name is whole: it loads, CRCs and all
        restored = TimeMachine().to(target, path, frozen=True)
        assert float(target.fc1.bias.detach()[0]) == restored.step
    TimeMachine(save_path=tmp_path).drop(target, "parent")  # the next write sweeps
    assert not [p for p in tmp_path.iterdir() if atomic.is_temp(p)]
    os.remove(tmp_path / "parent.safetensors")
    return len(temps)


def test_sigkill_during_drop_loses_nothing_and_the_next_drop_cleans_up(tmp_path):
    rng = random.Random(11)
    target = tcraft.realize(Net(hidden=HIDDEN))
    with subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as writer:
        try:
            swept = sum(one_round(writer, tmp_path, target, rng) for _ in range(4))
        finally:
            writer.kill()  # the fork server (its writer is already killed)
    print(f"temporary files of killed writers swept: {swept}")
