"""What the learner and the collectives use of a joined torch run (`TorchRuntime` meets it).

They annotate against this Protocol, not the runtime's class, which imports them.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

from dualtrain.multiverse.seams import Runtime

if TYPE_CHECKING:
    import torch

__all__ = ["Joined"]


class Joined(Runtime, Protocol):
    """A `Runtime` over torch: one replica a process, on `device`.

    Attributes:
        device: where this process's replica lives.
    """

    device: torch.device

    @property
    def comm_device(self) -> torch.device:
        """Where collectives' tensors live."""
        ...

    def counted_step(self) -> AbstractContextManager[None]:
        """One training step: synced forwards inside are not counted, the step is, once."""
        ...
