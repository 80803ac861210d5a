"""Two Nebulae v0.5 programs written against the compat namespace, with only imports changed.

They use every call Nebulae's own demo scripts (src/demo_cores.py, src/demo_dist.py at
v0.5.15) make, in the same patterns: a single-process run with a Comburant feeding a
Craft through a Tank, a dashboard and anchors; and a Multiverse run whose step functions
carry ``@Timer @mv.Executor`` and reduce their loss. Written here, small and quick; the
tests in test_nebulae_demos.py run them. Module level, so spawned workers import them.
"""

from __future__ import annotations

import os

import numpy as np

import dualtrain.compat.nebulae as neb
from dualtrain.compat.nebulae.astrobase import dock
from dualtrain.compat.nebulae.fuel import depot

SIDE = 16  # the packs' images are SIDE x SIDE


def single_process(root: str, epochs: int = 4) -> dict:
    """demo_cores's pattern; returns what the run measured, for the test to check."""
    bp = neb.aerolog.BluePrint(hidden=["is_train"], verbose=True)
    db = neb.aerolog.DashBoard(
        log_path=os.path.join(root, "log"), window=3, divisor=5, span=20,
        format={"Acc": [".2f", "percent"], "Loss": [".3f", "raw"]},
    )  # fmt: skip
    ng = neb.cockpit.Engine(device="cpu")
    tm = neb.cockpit.TimeMachine(save_path=os.path.join(root, "ckpt"),
                                 ckpt_path=os.path.join(root, "ckpt"))  # fmt: skip
    augment = depot.Comburant(depot.Brighten(0.1), depot.Rotate(5), depot.Resize((12, 12)),
                              depot.HWC2CHW(), is_encoded=True)  # fmt: skip
    plain = depot.Comburant(depot.Resize((12, 12)), depot.HWC2CHW(), is_encoded=True)

    def fetch(data, idx):
        return {"image": data["image"][idx], "label": data["label"][idx].astype("int64")}

    def prep_train(sample):
        sample["image"] = augment(sample["image"]) * 2 - 1
        return sample

    def prep_dev(sample):
        sample["image"] = plain(sample["image"]) * 2 - 1
        return sample

    spec = {"image": "vuint8", "label": "int64"}
    tk_train = depot.Tank(os.path.join(root, "train.hdf5"), spec, batch_size=16, shuffle=True,
                          fetch_fn=fetch, prep_fn=prep_train)  # fmt: skip
    tk_dev = depot.Tank(os.path.join(root, "dev.hdf5"), spec, batch_size=8, shuffle=False,
                        fetch_fn=fetch, prep_fn=prep_dev)  # fmt: skip

    class Net(dock.Craft):
        def __init__(self, nclass, scope):
            super().__init__(scope)
            pad = dock.autoPad((12, 12), (3, 3), 2)
            self.conv = dock.Conv(3, 6, (3, 3), stride=2, padding=pad, b_init=dock.Void())
            self.relu = dock.Relu()
            pad = dock.autoPad((6, 6), (2, 2), 2)
            self.mpool = dock.MaxPool((2, 2), padding=pad)
            self.flat = dock.Reshape()
            self.fc = dock.Dense(6 * 3 * 3, nclass)

        def run(self, x):
            self["input"] = x
            x = self.relu(self.conv(self["input"]))
            self["feat"] = self.mpool(x)
            return self.fc(self.flat(self["feat"], (x.shape[0], -1))), self["feat"]

    class Train(dock.Craft):
        def __init__(self, net, scope="TRAIN"):
            super().__init__(scope)
            self.net = net
            self.loss = dock.SftmXE(is_one_hot=False)
            self.acc = dock.AccCls(multi_class=False, is_one_hot=False)
            self.optz = dock.Momentum(
                self.net, 0.05, wd=1e-5, lr_decay=dock.StepLR(6, 0.8), warmup=2
            )

        @neb.toolkit.Timer
        def run(self, x, z):
            with dock.Rudder() as rud:
                self.net.gear(rud)
                y, _ = self.net(x)
                loss = self.loss(y, z)
                acc = self.acc(y, z)
                self.optz(loss)
            return loss, acc

    class Dev(dock.Craft):
        def __init__(self, net, scope="DEVELOP"):
            super().__init__(scope)
            self.net = net
            self.loss = dock.SftmXE(is_one_hot=False)
            self.acc = dock.AccCls(multi_class=False, is_one_hot=False)

        @neb.toolkit.Timer
        def run(self, x, z):
            with dock.Nozzle() as noz:
                self.net.gear(noz)
                y, _ = self.net(x)
                return self.loss(y, z), self.acc(y, z)

    net = Net(4, "cnn").gear(ng)
    train, dev = Train(net), Dev(net)
    losses, images, best = [], [], 0.0
    for epoch in range(epochs):
        mpe = tk_train.MPE
        for mile in range(mpe):
            batch = tk_train.next()
            images.append(dock.shell(batch["image"]))
            img, label = dock.coat(batch["image"]), dock.coat(batch["label"])
            duration, loss, acc = train(img, label)
            losses.append(dock.shell(loss))
            db.gauge({"Acc": dock.shell(acc), "Loss": dock.shell(loss)}, mile, epoch, mpe,
                     "TRAIN", interval=2, duration=duration)  # fmt: skip
        mpe = tk_dev.MPE
        for mile in range(mpe):
            batch = tk_dev.next()
            img, label = dock.coat(batch["image"]), dock.coat(batch["label"])
            duration, loss, acc = dev(img, label)
            db.gauge({"Acc": dock.shell(acc), "Loss": dock.shell(loss)}, mile, epoch, mpe,
                     "DEV", interval=1, duration=duration)  # fmt: skip
        curr = db.read("Acc", "DEV")
        if curr is not None and curr >= best:
            tm.drop(net)
            best = curr
    db.log()
    return {"losses": losses, "images": np.stack(images), "blueprint": bp, "net": net,
            "dev_acc": db.read("Acc", "DEV"), "train_mpe": tk_train.MPE}  # fmt: skip


def several_processes(mv=None):
    """demo_dist's pattern, under ``neb.law.Multiverse(several_processes, n)``."""
    root = os.environ["NEBULAE_PROGRAM_ROOT"]
    mv.init()
    formats = {"Acc": [".2f", "percent"], "Loss": [".3f", "raw"]}
    db = neb.aerolog.DashBoard(log_path=os.path.join(root, "dist_log"), window=2, divisor=5,
                               span=20, format=formats)  # fmt: skip
    ng = neb.cockpit.Engine(device="gpu", ngpus=mv.nworld)  # no GPU here: the CPU
    cb_train = depot.Comburant(depot.Resize((14, 14)), depot.Crop((12, 12)),
                               depot.Flip(0.5, depot.VERTICAL), is_encoded=True)  # fmt: skip
    cb_dev = depot.Comburant(depot.Resize((12, 12)), is_encoded=True)

    def fetch_train(data, idx):
        img = np.transpose(cb_train(data["image"][idx]), (2, 0, 1)).astype("float32")
        return {"image": img, "label": data["label"][idx].astype("int64")}

    def fetch_dev(data, idx):
        img = np.transpose(cb_dev(data["image"][idx]), (2, 0, 1)).astype("float32")
        return {"image": img, "label": data["label"][idx].astype("int64")}

    tk_train = depot.Tank(os.path.join(root, "train.hdf5"), "image", batch_size=8,
                          shuffle=True, fetch_fn=fetch_train)  # fmt: skip
    tk_dev = depot.Tank(os.path.join(root, "dev.hdf5"), "image", batch_size=4,
                        shuffle=False, fetch_fn=fetch_dev)  # fmt: skip

    with mv.scope():

        class Net(dock.Craft):
            def __init__(self, scope, nclass):
                super().__init__(scope)
                pad = dock.autoPad((12, 12), (3, 3), 2)
                self.conv = dock.Conv(3, 4, (3, 3), stride=2, padding=pad, b_init=None)
                self.relu = dock.Relu()
                self.mpool = dock.MaxPool((2, 2), padding=dock.autoPad((6, 6), (2, 2), 2))
                self.flat = dock.Reshape()
                self.fc = dock.Dense(4 * 3 * 3, nclass)

            def run(self, x):
                self["conv"] = self.conv(x)
                self["mpool"] = self.mpool(self.relu(self["conv"]))
                return self.fc(self.flat(self["mpool"], (x.shape[0], -1)))

        class Train(dock.Craft):
            def __init__(self, net, scope="TRAIN"):
                super().__init__(scope)
                self.scope = scope
                self.net = net
                self.loss = dock.SftmXE(is_one_hot=False)
                self.acc = dock.AccCls(multi_class=False, is_one_hot=False)
                self.optz = dock.Momentum(
                    net, 0.05, wd=1e-5, lr_decay=dock.STEP, lr_params=(5, 0.8)
                )

            @neb.toolkit.Timer
            @mv.Executor
            def run(self, x, z):
                with dock.Rudder() as rud:
                    self.net.gear(rud)
                    y = self.net(x)
                    loss = mv.reduce(self.loss(y, z))
                    acc = mv.reduce(self.acc(y, z))
                self.optz(loss)
                return loss, acc

        class Dev(dock.Craft):
            def __init__(self, net, scope="DEVELOP"):
                super().__init__(scope)
                self.net = net
                self.loss = dock.SftmXE(is_one_hot=False)
                self.acc = dock.AccCls(multi_class=False, is_one_hot=False)

            @neb.toolkit.Timer
            @mv.Executor
            def run(self, x, z):
                with dock.Nozzle() as noz:
                    self.net.gear(noz)
                    y = self.net(x)
                    return mv.reduce(self.loss(y, z)), mv.reduce(self.acc(y, z))

    net = Net("cnn", 4).gear(ng)
    net, tk_train, tk_dev = mv.sync(net, (tk_train, tk_dev))
    train, dev = Train(net), Dev(net)
    losses = []
    for epoch in range(3):
        mpe = tk_train.MPE
        for mile in range(mpe):
            batch = tk_train.next()
            duration, loss, acc = train(ng.coat(batch["image"]), ng.coat(batch["label"]))
            losses.append(ng.shell(loss))
            db.gauge({"Acc": ng.shell(acc), "Loss": losses[-1]}, mile, epoch, mpe, "TRAIN",
                     interval=1, duration=duration)  # fmt: skip
        mpe = tk_dev.MPE
        for mile in range(mpe):
            batch = tk_dev.next()
            duration, loss, acc = dev(ng.coat(batch["image"]), ng.coat(batch["label"]))
            db.gauge({"Acc": ng.shell(acc), "Loss": ng.shell(loss)}, mile, epoch, mpe, "DEV",
                     interval=1, duration=duration)  # fmt: skip
    db.log()
    weights = np.concatenate([p.detach().numpy().ravel() for p in net.parameters()])
    return {"rank": mv.rank, "losses": losses, "mpe": tk_train.MPE,
            "weights": mv.reduce(weights) - weights}  # fmt: skip
