"""Nebulae's ``nebulae.astrobase.hangar`` (its model zoo) is not carried over.

Its architectures (VGG, ResNet, SENet, the GANs) were Nebulae layer code with no dualtrain
counterpart; naming one, or importing it, raises a `RetiredError` that says what to use.
"""

from __future__ import annotations

from typing import NoReturn

from dualtrain.compat.retired import RetiredError

__all__: list[str] = []


def __getattr__(name: str) -> NoReturn:
    if name.startswith("__"):
        raise AttributeError(name)
    raise RetiredError(
        f"hangar.{name}: Nebulae's model zoo is not part of dualtrain. Write the model as a "
        "Craft with dock layers (class Net(dock.Craft)), or hold a torch module in one "
        "(self.body = a torch.nn.Module)",
        name=name,
    )
