"""Runs of a sharded EmbeddingStore that drop and resume anchors, for the world-size laws.

One global batch a step (`batch`), each process taking every `world`-th id of it with its
loss weights: the gradient each row gets (summed over processes) is the same whatever the
world size, so a run resumed at any world size continues as the uninterrupted one does.
`resume` is a Multiverse universe (importable by its spawned processes) and also runs in
the test's own process without a Multiverse (``mv=None``: one process, unsharded).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import dualtrain
from dualtrain import TimeMachine

ROWS, DIM, IDS = 10, 3, 6
STEPS, DROP_AT = 4, 2


def batch(step: int, rank: int, world: int) -> tuple[np.ndarray, np.ndarray]:
    """This process's ids and loss weights of global step `step`."""
    rng = np.random.default_rng(step)
    ids = rng.integers(0, ROWS, IDS)
    coef = rng.standard_normal((IDS, DIM)).astype(np.float32)
    return ids[rank::world], coef[rank::world]


def attached(fw: str, mode: str, mv: Any) -> Any:
    store = dualtrain.EmbeddingStore(ROWS, DIM, std=0.5, seed=3 if mv is None else 5)
    if mv is not None:
        mv.sync(store)
    if fw == "torch":
        import torch

        from dualtrain_torch import attach

        return attach(store, torch.optim.Adam, mode=mode, lr=0.1)
    import optax

    from dualtrain_jax import attach as jattach

    return jattach(store, optax.adam(0.1), mode=mode)


def train(rows: Any, fw: str, steps: range, rank: int, world: int) -> None:
    for k in steps:
        ids, c = batch(k, rank, world)
        e = rows.fetch(ids)
        if fw == "torch":
            import torch

            ((e * torch.from_numpy(c)).sum() + 0.5 * (e**2).sum()).backward()
            rows.step()
        else:
            import jax

            rows.step(jax.grad(lambda e, c=c: (e * c).sum() + 0.5 * (e**2).sum())(e))


def tables(rows: Any, mv: Any) -> dict[str, Any]:
    """The whole store (every process's rows joined): table, state, counters, step."""
    store = rows.store
    mine = {
        "start": store.rows.start,
        "weight": np.array(store.table),
        **{k: np.array(v) for k, v in store.state.items()},
        "counters": None if store.counters is None else np.array(store.counters),
    }
    parts = [mine] if mv is None else mv.runtime.gather_object(mine)
    parts.sort(key=lambda p: p["start"])
    out: dict[str, Any] = {"step": rows.steps}
    for key in mine:
        if key != "start" and mine[key] is not None:
            out[key] = np.concatenate([p[key] for p in parts])
    return out


def resume(mv: Any, fw: str, mode: str, folder: str, src: str | None, dst: str | None) -> dict:
    """Trains to `DROP_AT` (or loads `src` there), drops `dst`, trains to `STEPS`.

    Returns the store at `DROP_AT` ("at_drop") and after the last step, settled ("final").
    """
    rows = attached(fw, mode, mv)
    rank, world = (0, 1) if mv is None else (mv.rank, mv.processes)
    tm: Any = TimeMachine(save_path=folder)
    if mv is not None:
        tm = mv.time_machine(tm)
    if src is None:
        train(rows, fw, range(DROP_AT), rank, world)
    else:
        tm.to_embeddings(rows, src)
    at_drop = tables(rows, mv)
    if dst is not None:
        tm.drop_embeddings(rows, dst, extra={"world": world})
    train(rows, fw, range(DROP_AT, STEPS), rank, world)
    rows.settle()
    return {"at_drop": at_drop, "final": tables(rows, mv)}
