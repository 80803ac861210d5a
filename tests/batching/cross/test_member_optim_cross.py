"""Per-member training under torch and JAX: the same members step the same way in both."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

import dualtrain_jax  # noqa: E402
import dualtrain_torch  # noqa: E402
from dualtrain.batching.hyper import check_hyper  # noqa: E402
from dualtrain.errors import ArgumentError  # noqa: E402
from dualtrain_jax import batching as jax_batching  # noqa: E402
from dualtrain_torch import batching as torch_batching  # noqa: E402
from tests.batching.builders import Recipe, RecipeNet  # noqa: E402
from tests.batching.member_cases import hyper_cases  # noqa: E402

DOCS = Path(__file__).parents[3] / "docs" / "batching.md"
RECIPE = Recipe("mlp", features=3, hidden=4, classes=3, norm=False, dropout=False)


@settings(max_examples=4)
@given(case=hyper_cases(3, 3), steps=st.integers(1, 3), seed=st.integers(0, 2**64 - 1))
def test_torch_and_jax_step_each_member_alike(case, steps, seed):
    name, n, keywords = case
    craft = RecipeNet(RECIPE)
    x = np.random.default_rng(0).standard_normal((n, 4, 3))
    y = np.random.default_rng(1).integers(0, 3, (n, 4))
    tb = torch_batching.BatchModule(
        dualtrain_torch.realize(craft, dtype="float64"), n, seed=seed, strategy="vmap"
    )
    opt = dualtrain_torch.member_optimizer(tb, name, n, **keywords)
    for _ in range(steps):
        opt.zero_grad()
        torch_batching.batch_loss(tb(torch.as_tensor(x)), torch.as_tensor(y), n).sum().backward()
        opt.step()
    with jax.enable_x64(True):
        jb = jax_batching.BatchModule(
            dualtrain_jax.realize(craft, dtype="float64"), n, seed=seed, strategy="vmap"
        )
        tx = dualtrain_jax.member_optimizer(name, n, **keywords)
        params, opt_state = jb.params, tx.init(jb.params)

        def loss(params):
            out, _ = jb.apply(params, jb.state, jnp.asarray(x))
            return jax_batching.batch_loss(out, jnp.asarray(y), n).sum()

        for _ in range(steps):
            updates, opt_state = tx.update(jax.grad(loss)(params), opt_state, params)
            params = optax.apply_updates(params, updates)
        # Clipping differs by torch's 1e-6 in max / (norm + 1e-6), relatively 1e-6 / norm a
        # step, and Adam with beta1=0 passes it on whole (a fresh-clone run saw 3.2e-5 with
        # a clip of 0.0625); a wrong clip is off by the clip ratio itself. Without clipping,
        # rounding only.
        close = {"rtol": 1e-9, "atol": 1e-12}
        if keywords["max_grad_norm"] is not None:
            close = {"rtol": 1e-3, "atol": 1e-5}
        for key, value in params.items():
            np.testing.assert_allclose(
                np.asarray(value), tb.stack.get_parameter(key).detach().numpy(), **close
            )


def test_both_frameworks_refuse_the_same_values_with_the_same_words():
    bm = torch_batching.BatchModule(torch.nn.Linear(2, 2), 2, check_isolation=False)
    for bad in ({"lr": [0.1]}, {"lr": -1.0}, {"momentum": [0.1, float("nan")]}):
        with pytest.raises(ArgumentError) as from_torch:
            dualtrain_torch.member_optimizer(bm, "sgd", 2, **{"lr": 0.1} | bad)
        with pytest.raises(ArgumentError) as from_jax:
            dualtrain_jax.member_optimizer("sgd", 2, **{"lr": 0.1} | bad)
        assert str(from_torch.value) == str(from_jax.value)


def test_core_checks_take_lists_numpy_and_framework_arrays():
    for lr in ([0.1, 0.2], np.array([0.1, 0.2]), torch.tensor([0.1, 0.2]), jnp.array([0.1, 0.2])):
        np.testing.assert_allclose(check_hyper("sgd", 2, lr=lr).lr, [0.1, 0.2], rtol=1e-7)
    assert check_hyper("adam", 3, lr=0.5).lr.tolist() == [0.5] * 3


@pytest.mark.parametrize(
    ("make", "isolated"),
    [
        (lambda: optax.sgd(0.1, momentum=0.9), True),
        (lambda: optax.adam(0.1), True),
        (lambda: optax.adamw(0.1, weight_decay=0.1), True),
        (lambda: optax.chain(optax.clip_by_global_norm(0.1), optax.sgd(0.1)), False),
        (lambda: optax.adafactor(0.1, min_dim_size_to_factor=1), False),
    ],
    ids=["sgd", "adam", "adamw", "clip_by_global_norm", "adafactor"],
)
def test_plain_optax_over_the_stack_isolates_only_elementwise_transforms(make, isolated):
    def member_1_after(scale):
        rng = np.random.default_rng(0)
        params = {"w": jnp.ones((2, 3, 2)), "b": jnp.full((2, 3), 0.5)}
        tx = make()
        state = tx.init(params)
        for _ in range(3):
            grads = {
                k: jnp.asarray(rng.standard_normal(v.shape), v.dtype) for k, v in params.items()
            }
            grads = jax.tree.map(lambda g: g.at[0].multiply(scale), grads)  # member 0 only
            updates, state = tx.update(grads, state, params)
            params = optax.apply_updates(params, updates)
        return [np.asarray(v[1]) for v in params.values()]

    same = all(
        np.array_equal(a, b) for a, b in zip(member_1_after(1.0), member_1_after(5.0), strict=True)
    )
    assert same == isolated


def section_blocks() -> list[str]:
    text = DOCS.read_text()
    section = text.split("## Per-member hyper-parameters", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


def test_the_docs_learning_rate_sweeps_run_as_written():
    """docs/batching.md's two 16-member sweeps (torch, then JAX with the same Net)."""
    blocks = section_blocks()
    assert len(blocks) == 2 and "import torch" in blocks[0] and "import jax" in blocks[1]
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/batching.md per-member block {i}", "exec"), namespace)
        assert namespace["losses"].shape == (16,)
        assert namespace["lrs"].shape == (16,)
