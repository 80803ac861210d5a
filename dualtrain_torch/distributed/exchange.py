"""The all-to-all a sharded EmbeddingStore's batches travel by, on torch.distributed.

Rows live in host memory, so they travel over a gloo group of their own (made by every
process at once, when ``mv.sync(store)`` shards a store): a run on nccl keeps its device
collectives, and a rows exchange never waits behind DDP's buckets in flight on the default
group. Any dtype travels (bfloat16 included) as the bytes of its rows.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from dualtrain.embeddings.sharding import Counts, Exchange, Wire

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
        self, parts: list[np.ndarray], /, counts: Counts | None = None
    ) -> list[np.ndarray]:
        """Sends ``parts[j]`` to rank j; returns what each rank sent here, by rank.

        `counts`: what arrives, when known; else the lengths are exchanged first (one more
        collective). Its `most` is not needed: parts travel unpadded.
        """
        wire = Wire.of(parts)
        sent = [len(p) for p in parts]
        if counts is None:
            got = torch.empty(self.world, dtype=torch.int64)
            dist.all_to_all_single(got, torch.tensor(sent, dtype=torch.int64), group=self.group)
            receive = got.tolist()
        else:
            receive = list(counts.receive)
        send = np.concatenate([wire.pack(p) for p in parts])
        recv = np.empty((sum(receive), wire.width), np.uint8)
        dist.all_to_all_single(
            torch.from_numpy(recv),
            torch.from_numpy(send),
            output_split_sizes=receive,
            input_split_sizes=sent,
            group=self.group,
        )
        return np.split(wire.unpack(recv), np.cumsum(receive)[:-1])
