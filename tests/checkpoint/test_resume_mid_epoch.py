"""Stopped mid-epoch, resumed into fresh objects: the uninterrupted run's losses, bit for bit.

The Tank's state travels in ``extra=``, the optimizer's in the anchor, torch's global RNG
with ``restore_rng=True`` (docs/checkpoints.md, "Resuming mid-epoch exactly"). The run is
stopped inside an epoch, and continues across the next epoch's start.
"""

from __future__ import annotations

import csv
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from PIL import Image

from dualtrain import Craft, FuelGenerator, Tank, TimeMachine, dock

STEPS = 8  # 3 batches an epoch: the run crosses two epoch starts


class Small(Craft):
    def __init__(self) -> None:
        super().__init__("Small")
        self.fc1 = dock.Dense(36, 8)
        self.bn = dock.BatchNorm(8)
        self.fc2 = dock.Dense(8, 3)

    def run(self, x):
        return self.fc2(dock.tanh(self.bn(self.fc1(x))))


@pytest.fixture(scope="module")
def pack(tmp_path_factory: Any) -> list[str]:
    folder = tmp_path_factory.mktemp("pack")
    pixels = np.random.default_rng(1)
    with open(folder / "list.csv", "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["image", "label"])
        for i in range(24):
            image = pixels.integers(0, 255, (6, 6), dtype=np.uint8)
            Image.fromarray(image).save(folder / f"{i}.png")
            rows.writerow([f"{i}.png", str(i % 3)])
    gen = FuelGenerator(
        file_dir=str(folder), file_list=str(folder / "list.csv"), dtype=["vuint8", "int64"]
    )
    return gen.generate(str(folder / "p.h5"), 6, 6, channel=1, encode="PNG", workers=0).paths


SPEC = {"image": "uint8", "label": "int64"}


class TorchRun:
    def __init__(self, pack: list[str]) -> None:
        import torch

        from dualtrain_torch.craft import realize

        self.torch = torch
        torch.manual_seed(0)
        self.net = realize(Small(), seed=0)
        self.opt = torch.optim.Adam(self.net.parameters(), 1e-2)
        self.tank = Tank(pack, SPEC, batch_size=8, seed=3, to="torch")

    def step(self, _: int) -> float:
        torch, batch = self.torch, self.tank.next()
        x = batch["image"].reshape(len(batch["label"]), -1).float() / 255
        x = x + 0.1 * torch.randn_like(x)  # torch's global RNG: restore_rng must bring it back
        self.net.train()
        loss = torch.nn.functional.cross_entropy(self.net(x), batch["label"])
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()

    def drop(self, tm: TimeMachine, step: int) -> Any:
        extra = {"tank": self.tank.state_dict()}
        return tm.drop(self.net, "stop", optimizer=self.opt, step=step, extra=extra)

    def resume(self, tm: TimeMachine, anchor: Any, restore_rng: bool = True) -> int:
        restored = tm.to(self.net, anchor, optimizer=self.opt, restore_rng=restore_rng)
        self.tank.load_state_dict(restored.extra["tank"])
        assert restored.step is not None
        return restored.step


class JaxRun:
    def __init__(self, pack: list[str]) -> None:
        import jax
        import optax

        from dualtrain_jax.craft import realize

        self.jax, self.optax = jax, optax
        self.net = realize(Small(), seed=0)
        self.tx = optax.adam(1e-2)
        self.opt_state = self.tx.init(self.net.params)
        self.tank = Tank(pack, SPEC, batch_size=8, seed=3, to="jax")
        self.key = jax.random.key(7)

    def step(self, i: int) -> float:
        jax, optax, net, batch = self.jax, self.optax, self.net, self.tank.next()
        x = batch["image"].reshape(len(batch["label"]), -1).astype("float32") / 255
        # JAX has no global RNG: the step's key comes from the step number.
        x = x + 0.1 * jax.random.normal(jax.random.fold_in(self.key, i), x.shape)

        def loss(params, state):
            out, state = net.apply(params, state, x, train=True)
            return optax.softmax_cross_entropy_with_integer_labels(
                out, batch["label"]
            ).mean(), state

        (value, state), grads = jax.value_and_grad(loss, has_aux=True)(net.params, net.state)
        updates, self.opt_state = self.tx.update(grads, self.opt_state, net.params)
        net.params, net.state = optax.apply_updates(net.params, updates), state
        return float(value)

    def drop(self, tm: TimeMachine, step: int) -> Any:
        extra = {"tank": self.tank.state_dict()}
        return tm.drop(self.net, "stop", optimizer=self.opt_state, step=step, extra=extra)

    def resume(self, tm: TimeMachine, anchor: Any, restore_rng: bool = True) -> int:
        restored = tm.to(self.net, anchor, optimizer=self.opt_state, restore_rng=restore_rng)
        self.opt_state = restored.optimizer
        self.tank.load_state_dict(restored.extra["tank"])
        assert restored.step is not None
        return restored.step


RUNS = {"torch": TorchRun, "jax": JaxRun}


@pytest.mark.parametrize("framework", sorted(RUNS))
@settings(max_examples=3)
@given(stop=st.integers(1, STEPS - 1))
def test_resumed_losses_equal_the_uninterrupted_run_bit_for_bit(
    pack, tmp_path_factory, framework, stop
):
    pytest.importorskip(framework)
    run = RUNS[framework]
    straight = run(pack)
    uninterrupted = [straight.step(i) for i in range(STEPS)]

    first = run(pack)
    before = [first.step(i) for i in range(stop)]
    tm = TimeMachine(save_path=tmp_path_factory.mktemp("ckpt"))
    anchor = first.drop(tm, stop)
    del first  # the run is over: only the anchor remains

    resumed = run(pack)  # fresh objects, built as a new process would build them
    at = resumed.resume(tm, anchor)
    after = [resumed.step(i) for i in range(at, STEPS)]
    assert before + after == uninterrupted


def test_without_the_rng_torch_resumes_differently(pack, tmp_path):
    """The law above is not vacuous: torch's noise needs its generator back."""
    pytest.importorskip("torch")
    straight = TorchRun(pack)
    uninterrupted = [straight.step(i) for i in range(STEPS)]
    first = TorchRun(pack)
    [first.step(i) for i in range(4)]
    anchor = first.drop(TimeMachine(save_path=tmp_path), 4)
    resumed = TorchRun(pack)
    resumed.resume(TimeMachine(save_path=tmp_path), anchor, restore_rng=False)
    assert [resumed.step(i) for i in range(4, STEPS)] != uninterrupted[4:]
