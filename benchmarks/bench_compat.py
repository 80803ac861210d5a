"""What the Nebulae compat namespace costs a migrated program, per step, against plain torch.

A Nebulae program (demo_cores's network: Conv 3->8 stride 2 with autoPad, Relu, MaxPool 2,
Dense 512->10; SftmXE, AccCls, Momentum) run through `dualtrain.compat.nebulae`, beside the
same step written in plain torch (``nn.Conv2d`` after ``F.pad``, ``F.relu``,
``F.max_pool2d``, ``nn.Linear``, ``F.cross_entropy``, ``torch.optim.SGD``), alternating
samples. Rows: a training step (forward, loss, accuracy, backward, SGD step) and an
inference step under ``torch.no_grad``, at batch 32 and 128 on 3x32x32 images.

    python benchmarks/bench_compat.py [--threads 1] [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness

args = harness.parse_args("compat")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402, N812
from torch import nn  # noqa: E402

harness.set_torch_threads(args.threads)

from dualtrain.compat.nebulae.astrobase import dock  # noqa: E402


class Net(dock.Craft):
    def __init__(self, nclass: int, scope: str) -> None:
        super().__init__(scope)
        pad = dock.autoPad((32, 32), (3, 3), 2)
        self.conv = dock.Conv(3, 8, (3, 3), stride=2, padding=pad, b_init=dock.Void())
        self.relu = dock.Relu()
        self.mpool = dock.MaxPool((2, 2), padding=dock.autoPad((16, 16), (2, 2), 2))
        self.flat = dock.Reshape()
        self.fc = dock.Dense(512, nclass)

    def run(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mpool(self.relu(self.conv(x)))
        return self.fc(self.flat(x, (x.shape[0], -1)))


class Train(dock.Craft):
    def __init__(self, net: Net) -> None:
        super().__init__("TRAIN")
        self.net = net
        self.loss = dock.SftmXE(is_one_hot=False)
        self.acc = dock.AccCls(multi_class=False, is_one_hot=False)
        self.optz = dock.Momentum(net, 1e-3, wd=4e-5)

    def run(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with dock.Rudder() as rud:
            self.net.gear(rud)
            y = self.net(x)
            loss, acc = self.loss(y, z), self.acc(y, z)
            self.optz(loss)
        return loss, acc


class Plain(nn.Module):
    def __init__(self, nclass: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, bias=False)
        self.fc = nn.Linear(512, nclass)
        self.pad = [int(p) for p in dock.autoPad((32, 32), (3, 3), 2)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv(F.pad(x, self.pad))), 2, 2)
        return self.fc(x.reshape(x.shape[0], -1))


def rows() -> list[harness.Row]:
    out = []
    for batch in (32, 128):
        torch.manual_seed(0)
        x, z = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
        net = Net(10, "cnn")
        train = Train(net)
        plain = Plain(10)
        plain.load_state_dict(
            {"conv.weight": net.conv.module().conv.weight, **{
                f"fc.{k}": v for k, v in net.fc.module().fc.state_dict().items()}},
        )  # fmt: skip
        sgd = torch.optim.SGD(plain.parameters(), lr=1e-3, momentum=0.9, weight_decay=4e-5)

        def plain_step(plain=plain, sgd=sgd, x=x, z=z) -> None:
            plain.train()
            y = plain(x)
            loss = F.cross_entropy(y, z)
            (y.argmax(-1) == z).float().mean()
            sgd.zero_grad()
            loss.backward()
            sgd.step()

        out.append(harness.compare(f"train step, batch {batch}", baseline=plain_step,
                                   ours=lambda train=train, x=x, z=z: train(x, z),
                                   baseline_name="plain torch", quick=args.quick))  # fmt: skip

        def plain_eval(plain=plain, x=x) -> None:
            plain.eval()
            with torch.no_grad():
                plain(x)

        def ours_eval(net=net, x=x) -> None:
            with dock.Nozzle() as noz:
                net.gear(noz)
                net(x)

        out.append(harness.compare(f"inference, batch {batch}", baseline=plain_eval,
                                   ours=ours_eval, baseline_name="plain torch",
                                   quick=args.quick))  # fmt: skip
    return out


if __name__ == "__main__":
    harness.report("compat", rows(), args, torch=torch.__version__)
