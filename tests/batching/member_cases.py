"""Hypothesis cases for the per-member optimizer laws, shared by the torch, JAX and cross tests."""

from __future__ import annotations

import math

from hypothesis import strategies as st

from dualtrain.batching.hyper import OPTIMIZERS


@st.composite
def hyper_cases(draw, max_batch: int = 3, min_batch: int = 1):
    """``(name, batch, keywords)`` for ``member_optimizer``: each value a float or a list.

    (JAX compiles each op per shape: its tests fix the member count to reuse the caches.)
    """
    name = draw(st.sampled_from(OPTIMIZERS))
    n = draw(st.integers(min_batch, max_batch))

    def per(low: float, high: float):
        one = st.floats(low, high)
        return draw(one | st.lists(one, min_size=n, max_size=n))

    keywords = {"lr": per(0.0, 0.5), "weight_decay": per(0.0, 0.3)}
    if name == "sgd":
        nesterov = draw(st.booleans())
        keywords["momentum"] = per(0.05 if nesterov else 0.0, 0.95)
        keywords["nesterov"] = nesterov
    else:
        keywords["betas"] = (per(0.0, 0.95), per(0.5, 0.999))
        keywords["eps"] = per(1e-8, 1e-3)
    norms = st.floats(0.01, 2.0) | st.just(math.inf)
    keywords["max_grad_norm"] = draw(st.none() | st.lists(norms, min_size=n, max_size=n))
    return name, n, keywords


def member_value(value, i: int):
    """Member i's share of a keyword's value (a float, a list, or a pair of those)."""
    if isinstance(value, tuple):
        return tuple(member_value(v, i) for v in value)
    return value[i] if isinstance(value, list) else value
