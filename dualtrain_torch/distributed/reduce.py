"""torch's `reduce`: a structure's leaves onto the wire, one all-reduce a dtype, and back.

The JAX adapter's ``distributed.reduce`` has the same role. Every leaf is copied (the caller's
value is never changed); layouts are compared across processes before any value moves.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dualtrain.errors import ArgumentError, bad_argument
from dualtrain_torch.distributed.exit import handed
from dualtrain_torch.distributed.rows import Joined

__all__ = ["reduce_value"]

_LEAF = "a number, a torch tensor, a NumPy array, or a tuple, list or dict of them"


def reduce_value(runtime: Joined, value: Any, aggregate: bool) -> Any:
    """`value` summed (`aggregate`) or averaged over the processes: `TorchRuntime.reduce`."""
    leaves: list[Any] = []
    _collect(value, leaves)
    wires = [_wire(leaf) for leaf in leaves]
    _same_layout(runtime, _layout(value, iter(wires)))
    results: list[torch.Tensor | None] = [None] * len(leaves)
    for dtype in sorted({w.dtype for w in wires}, key=str):  # the same order on every rank
        picked = [i for i, w in enumerate(wires) if w.dtype == dtype]
        flat = torch.cat([wires[i].reshape(-1) for i in picked]).to(runtime.comm_device)
        if runtime.nworld > 1:  # a world of one has no group: its sum is its value
            handed(flat)
            dist.all_reduce(flat)
        parts = flat.cpu().split([wires[i].numel() for i in picked])
        for i, part in zip(picked, parts, strict=True):
            results[i] = part.reshape(wires[i].shape)
    pairs = zip(leaves, results, strict=True)
    return _rebuild(value, iter(_back(leaf, r, aggregate, runtime.nworld) for leaf, r in pairs))


def _same_layout(runtime: Joined, layout: str) -> None:
    """Refuses, on every process at once, values whose layouts differ across processes.

    Unchecked, a mismatch pairs different buffers in the all-reduce: it hangs until the
    timeout, aborts the process (gloo), or sums the wrong leaves silently (dict keys in
    another order). One all-reduce of a (2,) tensor, the same on every process, finds
    it: the maximum of the layout's checksum and of its negation differ.
    """
    if runtime.nworld == 1:
        return
    mine = zlib.crc32(layout.encode())
    bounds = torch.tensor([mine, -mine], dtype=torch.int64, device=runtime.comm_device)
    handed(bounds)
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX)
    if int(bounds[0]) == -int(bounds[1]):
        return
    layouts = runtime.gather_object(layout[:200])  # every process is here: none waits
    seen = "; ".join(f"rank {rank}: {text}" for rank, text in enumerate(layouts))
    raise ArgumentError(
        f"value must have the same structure, keys, dtypes and shapes on every process "
        f"(reduce combines them leaf by leaf); got by rank: {seen}"
    )


def _collect(value: Any, leaves: list[Any]) -> None:
    if isinstance(value, dict):
        for item in value.values():
            _collect(item, leaves)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _collect(item, leaves)
    elif isinstance(value, (torch.Tensor, np.ndarray, np.generic, bool, int, float)):
        if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind not in "biuf":
            raise bad_argument("value", value, _LEAF + " (bool, integer or float)")
        if isinstance(value, torch.Tensor) and value.is_complex():
            raise bad_argument("value", value, _LEAF + " (bool, integer or float)")
        leaves.append(value)
    else:
        raise bad_argument("value", value, _LEAF)


def _wire(leaf: Any) -> torch.Tensor:
    """A copy of `leaf` as a CPU tensor in the dtype it is reduced in."""
    if isinstance(leaf, torch.Tensor):
        t = leaf.detach()
    elif isinstance(leaf, (np.ndarray, np.generic)):
        t = torch.from_numpy(np.array(leaf, copy=True))
    else:
        t = torch.tensor(leaf, dtype=torch.float64 if isinstance(leaf, float) else torch.int64)
    if t.is_floating_point():
        wire = torch.float64 if t.dtype == torch.float64 else torch.float32
    else:
        wire = torch.int64
    return t.to("cpu", wire, copy=True)


def _layout(value: Any, wires: Iterator[torch.Tensor]) -> str:
    """`value`'s structure with each leaf as its wire dtype and shape: what must match."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_layout(v, wires)}" for k, v in value.items()) + "}"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_layout(v, wires) for v in value) + "]"
    wire = next(wires)
    return f"{str(wire.dtype).removeprefix('torch.')}{list(wire.shape)}"


def _back(leaf: Any, summed: Any, aggregate: bool, nworld: int) -> Any:
    if isinstance(leaf, torch.Tensor):
        floating = leaf.is_floating_point()
    elif isinstance(leaf, (np.ndarray, np.generic)):
        floating = leaf.dtype.kind == "f"
    else:
        floating = isinstance(leaf, float)
    if floating:
        out = summed if aggregate else summed / nworld
        dtype = leaf.dtype if isinstance(leaf, torch.Tensor) else None
    else:
        out = summed if aggregate else summed.double() / nworld
        dtype = torch.int64 if aggregate else torch.float64
    if isinstance(leaf, torch.Tensor):
        return out.to(leaf.device, dtype)
    if isinstance(leaf, (np.ndarray, np.generic)):
        array = out.numpy().astype(leaf.dtype if floating else out.numpy().dtype)
        return array[()] if isinstance(leaf, np.generic) else array
    return out.item()


def _rebuild(value: Any, results: Iterator[Any]) -> Any:
    if isinstance(value, dict):
        pairs = [(key, _rebuild(item, results)) for key, item in value.items()]
        return dict(pairs) if type(value) is dict else type(value)(pairs)
    if isinstance(value, list):
        return [_rebuild(item, results) for item in value]
    if isinstance(value, tuple):
        items = [_rebuild(item, results) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return next(results)
