"""The two adapters' transfer modules mirror each other: names, signatures, refusals, Tank."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

from dualtrain import ArgumentError
from dualtrain.fuel import FuelGenerator, Tank
from tests.fuel.raw import DTYPES, make_folder

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

from dualtrain_jax import transfer as jax_transfer  # noqa: E402
from dualtrain_torch import transfer as torch_transfer  # noqa: E402

MODULES = {"torch": torch_transfer, "jax": jax_transfer}


def _parameters(fn) -> list[tuple[str, object, object]]:
    """Names, kinds and defaults (the types differ: torch.device against jax.Device)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_both_adapters_export_the_same_names_with_the_same_signatures():
    assert torch_transfer.__all__ == jax_transfer.__all__
    for name in torch_transfer.__all__:
        a, b = getattr(torch_transfer, name), getattr(jax_transfer, name)
        assert _parameters(a) == _parameters(b), name
    for method in ("__call__", "put"):
        a, b = (getattr(m.Transfer, method) for m in MODULES.values())
        assert _parameters(a) == _parameters(b), method


def _template(message: str) -> str:
    """The message with the framework's name and its list of devices taken out."""
    message = re.sub(r"\b(torch|JAX)\b", "<fw>", message)
    return re.sub(r"\('cpu'[^;)]*", "(<known>", message)


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cpu:x", "cuda:99", 2.5])
def test_a_bad_device_reads_the_same_under_both(device):
    texts = []
    for module in MODULES.values():
        with pytest.raises(ArgumentError) as info:
            module.Transfer(device)
        texts.append(_template(str(info.value)))
    assert texts[0] == texts[1]
    assert texts[0].startswith("device must be a device <fw> has here (<known>")
    assert texts[0].endswith(f"; got device={device!r}")


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("raw")
    make_folder(str(folder), 5)
    gen = FuelGenerator(file_dir=str(folder), file_list=str(folder / "list.csv"), dtype=DTYPES)
    return gen.generate(str(folder / "p.npz"), 5, 16, encode="PNG", workers=0).paths


@pytest.mark.parametrize("to", ["torch", "jax"])
def test_tank_delivers_to_cpu_through_the_transfer_under_both(pack, to):
    """device="cpu" names the host under both frameworks (JAX's Tank refused it before)."""
    tank = Tank(pack, {"label": "int64"}, 2, to=to, device="cpu", seed=1)
    assert isinstance(tank._deliver, MODULES[to].Transfer)
    batch = tank.next()
    plain = Tank(pack, {"label": "int64"}, 2, seed=1).next()
    label = batch["label"]
    where = label.device.type if to == "torch" else next(iter(label.devices())).platform
    assert where == "cpu"
    np.testing.assert_array_equal(np.asarray(label), plain["label"])
