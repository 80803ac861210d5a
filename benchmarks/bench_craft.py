"""A realized Craft against the same network written by hand, one train step, both frameworks.

Models: an MLP 784-256-256-10 and a small CNN (32x32x3 -> conv 32 -> pool -> conv 64 ->
pool -> dense 10), batch 64, softmax cross-entropy, SGD. torch: CraftModule vs nn.Sequential
(eager). JAX: the Craft's ``apply`` vs plain ``lax``/``jnp`` functions, each step one jitted
function. Target: within 5% of the hand-written step (ratio >= 0.95).

    ./dev bench craft [--threads 1] [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness

args = harness.parse_args("craft")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import torch  # noqa: E402
from jax import lax  # noqa: E402
from torch import nn  # noqa: E402

from dualtrain import Craft, dock  # noqa: E402
from dualtrain_jax.craft import realize as jax_realize  # noqa: E402
from dualtrain_torch.craft import realize as torch_realize  # noqa: E402

harness.set_torch_threads(args.threads)


class MLP(Craft):
    def __init__(self):
        super().__init__("MLP")
        self.fc1, self.fc2, self.fc3 = (
            dock.Dense(784, 256),
            dock.Dense(256, 256),
            dock.Dense(256, 10),
        )

    def run(self, x):
        return self.fc3(dock.relu(self.fc2(dock.relu(self.fc1(x)))))


class CNN(Craft):
    def __init__(self):
        super().__init__("CNN")
        self.conv1 = dock.Conv(3, 32, 3, padding=1)
        self.conv2 = dock.Conv(32, 64, 3, padding=1)
        self.pool = dock.MaxPool(2)
        self.flat = dock.Flatten()
        self.fc = dock.Dense(64 * 8 * 8, 10)

    def run(self, x):
        x = self.pool(dock.relu(self.conv1(x)))
        x = self.pool(dock.relu(self.conv2(x)))
        return self.fc(self.flat(x))


def torch_by_hand(name):
    if name == "MLP":
        return nn.Sequential(
            nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
        )
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 10),
    )  # fmt: skip


def torch_step(model, x, y):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    return step


def jax_by_hand(name, values):
    """The same network as plain JAX functions over the same parameter dict."""
    dn = ("NCHW", "OIHW", "NCHW")

    def conv(p, x, key):
        y = lax.conv_general_dilated(
            x, p[f"{key}.weight"], (1, 1), ((1, 1), (1, 1)), dimension_numbers=dn
        )
        return y + p[f"{key}.bias"].reshape(1, -1, 1, 1)

    def pool(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def forward(p, x):
        if name == "MLP":
            h = jax.nn.relu(x @ p["fc1.weight"].T + p["fc1.bias"])
            h = jax.nn.relu(h @ p["fc2.weight"].T + p["fc2.bias"])
            return h @ p["fc3.weight"].T + p["fc3.bias"]
        h = pool(jax.nn.relu(conv(p, x, "conv1")))
        h = pool(jax.nn.relu(conv(p, h, "conv2")))
        return h.reshape(h.shape[0], -1) @ p["fc.weight"].T + p["fc.bias"]

    return forward


def jax_step(forward, params, x, y):
    tx = optax.sgd(0.01)

    @jax.jit
    def update(p, s):
        _, g = jax.value_and_grad(
            lambda p: optax.softmax_cross_entropy_with_integer_labels(forward(p, x), y).mean()
        )(p)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    state = {"p": params, "s": tx.init(params)}

    def step():
        state["p"], state["s"] = update(state["p"], state["s"])
        jax.block_until_ready(state["p"])

    return step


def main():
    rows = []
    rng = np.random.default_rng(0)
    for name, craft, shape in (("MLP", MLP(), (64, 784)), ("CNN", CNN(), (64, 3, 32, 32))):
        x = rng.normal(size=shape).astype(np.float32)
        y = rng.integers(0, 10, 64)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        rows.append(harness.compare(
            f"torch {name} train step", baseline_name="nn.Sequential by hand",
            baseline=torch_step(torch_by_hand(name), xt, yt),
            ours=torch_step(torch_realize(craft, seed=0), xt, yt), quick=args.quick,
        ))  # fmt: skip
        jm = jax_realize(craft, seed=0)
        xj, yj = jnp.asarray(x), jnp.asarray(y)
        rows.append(harness.compare(
            f"JAX {name} train step (jit)", baseline_name="lax/jnp by hand",
            baseline=jax_step(jax_by_hand(name, jm.params), dict(jm.params), xj, yj),
            ours=jax_step(lambda p, x, jm=jm: jm.apply(p, jm.state, x)[0], dict(jm.params), xj, yj),
            quick=args.quick,
        ))  # fmt: skip
    harness.report("craft", rows, args, torch=torch.__version__, jax=jax.__version__)


if __name__ == "__main__":
    main()
