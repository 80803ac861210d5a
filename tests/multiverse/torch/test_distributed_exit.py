"""Leaving a gloo group waits until its threads dropped the collectives' tensors.

The abort this prevents is a race at interpreter exit (tests/multiverse/torch/test_distributed.py
checks, over two real gloo processes, that nothing is left in flight after `release`);
here the waiting rule itself, on a fake clock.
"""

from __future__ import annotations

import gc

import torch
from hypothesis import given, settings, strategies as st

from dualtrain_torch.distributed.exit import WINDOW_S, handed, in_flight, release


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.on_sleep: list = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        for action in self.on_sleep:
            action()


def test_release_waits_until_the_last_handed_tensor_is_dropped() -> None:
    held = [torch.ones(3), torch.zeros(2)]
    handed(*held)
    assert in_flight() == 2
    fake = FakeTime()
    # a worker thread drops one tensor at each sleep
    fake.on_sleep.append(lambda: held.pop() if held else None)
    assert release(limit_s=5.0, sleep=fake.sleep, clock=fake.clock)
    assert in_flight() == 0
    assert fake.sleeps[-1] == WINDOW_S  # the window for collectives not handed here
    assert len(fake.sleeps) == 3  # two waits, one per tensor, then the window


@settings(max_examples=20, deadline=None)
@given(limit=st.floats(0.0, 0.5))
def test_release_gives_up_after_its_limit_and_says_so(limit: float) -> None:
    kept = torch.ones(1)  # a caller still holds it: never dropped by a worker
    handed(kept)
    fake = FakeTime()
    assert not release(limit_s=limit, sleep=fake.sleep, clock=fake.clock)
    assert fake.now <= limit + 0.001 + WINDOW_S + 1e-9
    del kept
    gc.collect()
    assert in_flight() == 0


def test_nothing_handed_costs_only_the_window() -> None:
    gc.collect()
    fake = FakeTime()
    assert release(sleep=fake.sleep, clock=fake.clock)
    assert fake.sleeps == [WINDOW_S]
