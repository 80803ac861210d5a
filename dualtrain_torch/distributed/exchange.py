"""The all-to-all a sharded EmbeddingStore's batches travel by, on torch.distributed.

Rows live in host memory, so they travel over a gloo group of their own (made by every
process at once, when ``mv.sync(store)`` shards a store): a run on nccl keeps its device
collectives, and a rows exchange never waits behind DDP's buckets in flight on the default
group. Any dtype travels (bfloat16 included) as the bytes of its rows.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as dist

from dualtrain.embeddings.sharding import Exchange

__all__ = ["TorchExchange"]


class TorchExchange:
    """``dist.all_to_all_single`` over a gloo group (`dualtrain.embeddings.Exchange`).

    Each call is one collective when the caller knows what it will receive (`lengths`, once
    a batch, tells it), else two: the lengths first. Every process must call it in the same
    order.

    Attributes:
        rank: this process's rank.
        world: processes in the run.
        group: the gloo group it runs on.
        ahead: a second exchange on a gloo group of its own, for a prefetch's thread (its
            collectives then never interleave with this one's), or None in that one.

    Args:
        ahead: whether to make the second exchange.
    """

    def __init__(self, *, ahead: bool = True) -> None:
        self.group = dist.new_group(backend="gloo")  # a collective: every rank makes it
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.ahead: Exchange | None = TorchExchange(ahead=False) if ahead else None

    def lengths(self, sent: list[int], /) -> np.ndarray:
        """Every rank's part lengths, int64 [world, world] (``dist.all_gather``)."""
        mine = torch.tensor(sent, dtype=torch.int64)
        every = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(every, mine, group=self.group)
        return torch.stack(every).numpy()

    def all_to_all(
        self,
        parts: list[np.ndarray],
        /,
        receive: list[int] | None = None,
        most: int | None = None,
    ) -> list[np.ndarray]:
        """Sends ``parts[j]`` to rank j; returns what each rank sent here, by rank.

        `receive`: the lengths each rank sends here, when known; else they are exchanged
        first (one more collective). `most` is not needed: parts travel unpadded.
        """
        first = parts[0]
        dtype, trail = first.dtype, first.shape[1:]
        width = dtype.itemsize * math.prod(trail)  # bytes a row
        sent = [len(p) for p in parts]
        if receive is None:
            got = torch.empty(self.world, dtype=torch.int64)
            dist.all_to_all_single(got, torch.tensor(sent, dtype=torch.int64), group=self.group)
            receive = got.tolist()
        send = np.concatenate(
            [np.ascontiguousarray(p).view(np.uint8).reshape(len(p), width) for p in parts]
        )
        counts = list(receive)
        recv = np.empty((sum(counts), width), np.uint8)
        dist.all_to_all_single(
            torch.from_numpy(recv),
            torch.from_numpy(send),
            output_split_sizes=counts,
            input_split_sizes=sent,
            group=self.group,
        )
        rows = recv.view(dtype).reshape(-1, *trail)
        return np.split(rows, np.cumsum(counts)[:-1])
