"""Training runs the embedding laws compare: the store under torch or JAX, and the plain
dense references (a full-table parameter with the same optimizer)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import dualtrain

ROWS, DIM, SEED = 40, 3, 7


def batches(max_steps: int = 6) -> st.SearchStrategy:
    """Lists of id arrays with many repeats (ids from a small range of the table)."""
    one = st.lists(st.integers(0, ROWS - 1), min_size=1, max_size=12).map(np.array)
    return st.lists(one, min_size=1, max_size=max_steps)


def coef(step: int, n: int) -> np.ndarray:
    """The loss weights of step `step`: loss = sum(e * c) + 0.5 * sum(e**2)."""
    return np.random.default_rng(step).standard_normal((n, DIM)).astype(np.float32)


def store(pinned: bool | None = False) -> dualtrain.EmbeddingStore:
    """The table every law starts from (plain memory unless asked: CPU runs stay on the CPU)."""
    return dualtrain.EmbeddingStore(ROWS, DIM, std=0.5, seed=SEED, pinned=pinned)


def run_torch(cls, kw, mode, steps, prefetch=False, pinned=False):
    import torch

    from dualtrain_torch import attach

    s = store(pinned)
    rows = attach(s, cls, mode=mode, **kw)
    for k, ids in enumerate(steps):
        e = rows.fetch(ids)
        if prefetch and k + 1 < len(steps):
            rows.prefetch(steps[k + 1])
        weights = torch.from_numpy(coef(k, len(ids))).to(e.device)  # rows come on a pinned
        ((e * weights).sum() + 0.5 * (e**2).sum()).backward()  # store's device: CUDA
        rows.step()
    rows.settle()
    rows.flush()
    return s, rows


def run_jax(tx, mode, steps, prefetch=False):
    import jax

    from dualtrain_jax import attach

    s = store()
    rows = attach(s, tx, mode=mode)
    for k, ids in enumerate(steps):
        e = rows.fetch(ids)
        if prefetch and k + 1 < len(steps):
            rows.prefetch(steps[k + 1])
        c = coef(k, len(ids))
        rows.step(jax.grad(lambda e, c=c: (e * c).sum() + 0.5 * (e**2).sum())(e))
    rows.settle()
    rows.flush()
    return s, rows


def dense_torch(cls, kw, steps, touched_only):
    """torch.optim on the whole table; with `touched_only`, untouched rows and their state
    are put back after each step (the lazy reference)."""
    import torch

    w = torch.nn.Parameter(torch.from_numpy(store().table.copy()))
    opt = cls([w], **kw)
    for k, ids in enumerate(steps):
        opt.zero_grad()
        e = w[torch.from_numpy(ids)]
        weights = torch.from_numpy(coef(k, len(ids))).to(e.device)  # rows come on a pinned
        ((e * weights).sum() + 0.5 * (e**2).sum()).backward()  # store's device: CUDA
        before = w.detach().clone()
        state = {n: v.clone() for n, v in opt.state[w].items() if torch.is_tensor(v)}
        opt.step()
        if touched_only:
            keep = torch.ones(ROWS, dtype=torch.bool)
            keep[torch.from_numpy(ids)] = False
            with torch.no_grad():
                w[keep] = before[keep]
            # A row never touched holds the state torch starts a row with: zeros, but
            # Rprop's step sizes start at lr and Adagrad's sums at initial_accumulator_value.
            fresh = {"step_size": kw.get("lr", 0.01),
                     "sum": kw.get("initial_accumulator_value", 0.0)}  # fmt: skip
            for n, v in opt.state[w].items():
                if torch.is_tensor(v) and v.shape == w.shape:
                    v[keep] = state[n][keep] if n in state else fresh.get(n, 0.0)
    return w.detach().numpy()


def dense_jax(tx, steps, touched_only):
    """optax on the whole table, likewise."""
    import jax
    import jax.numpy as jnp
    import optax

    w = jnp.asarray(store().table)
    state = tx.init(w)
    for k, ids in enumerate(steps):
        c = coef(k, len(ids))
        g = jax.grad(lambda w, c=c, ids=ids: (w[ids] * c).sum() + 0.5 * (w[ids] ** 2).sum())(w)
        updates, new_state = tx.update(g, state, w)
        new_w = optax.apply_updates(w, updates)
        if touched_only:
            hit = np.zeros((ROWS, 1), bool)
            hit[ids] = True

            def pick(new, old, hit=hit, shape=w.shape):
                return jnp.where(hit, new, old) if jnp.shape(new) == shape else new

            new_w = pick(new_w, w)
            new_state = jax.tree_util.tree_map(pick, new_state, state)
        w, state = new_w, new_state
    return np.asarray(w)
