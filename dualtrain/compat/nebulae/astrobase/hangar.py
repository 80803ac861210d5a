"""Nebulae's ``nebulae.astrobase.hangar`` (its model zoo) is not carried over.

Its architectures (VGG, ResNet, SENet, the GANs) were Nebulae layer code with no dualtrain
counterpart; naming one raises an error that says what to use instead.
"""

from __future__ import annotations

from typing import Any

from dualtrain.errors import ArgumentError

__all__: list[str] = []


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise ArgumentError(
        f"hangar.{name}: Nebulae's model zoo is not part of dualtrain. Write the model as a "
        "Craft with dock layers (class Net(dock.Craft)), or hold a torch module in one "
        "(self.body = torchvision_or_your_module)"
    )
