"""Nebulae's ``nebulae.aerolog.BluePrint``: made as Nebulae's; drawing is not carried over.

Nebulae drew a Craft's graph with graphviz from its Pods (``>`` / ``+`` formulas), which
dualtrain's Crafts do not have. A BluePrint can be made (the demos make one and never use
it); `paint` and `log` raise an error that says what to use instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dualtrain.compat.nebulae.config import from_config
from dualtrain.errors import ArgumentError, bad_argument

__all__ = ["BluePrint"]

_INSTEAD = (
    "BluePrint drew Nebulae's Pod graphs, which dualtrain Crafts do not have: print the "
    "realized module (print(dualtrain_torch.realize(craft))) for its layers, or export it "
    "with torch.onnx.export for a graph"
)


class BluePrint:
    """``BluePrint(config=None, verbose=True, hidden=[])``."""

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        verbose: bool = True,
        hidden: Sequence[str] = (),
    ) -> None:
        given = from_config(config, "BluePrint", {"verbose": verbose, "hidden": hidden})
        verbose, hidden = given["verbose"], given["hidden"]
        if not isinstance(verbose, bool):
            raise bad_argument("verbose", verbose, "a bool")
        if isinstance(hidden, str) or not all(isinstance(h, str) for h in hidden):
            raise bad_argument("hidden", hidden, "a list of node names")
        self.verbose, self.hidden = verbose, list(hidden)

    def paint(self, archit: Any, *slot: Any) -> None:
        """Not built: raises an ArgumentError naming what to use instead."""
        raise ArgumentError(_INSTEAD)

    def log(self, log_dir: Any = None, graph_name: Any = None) -> None:
        """Not built: raises an ArgumentError naming what to use instead."""
        raise ArgumentError(_INSTEAD)
