"""torchmb's checks that a batched model is its members (``torchmb.tests``).

`test_model_batching` batches a model and hands it to `test_batched_model`: member g, given
weights of its own, must give what the plain model gives with those weights, within torchmb's
tolerances. Named like tests, they are helpers for the user's tests; they carry
``__test__ = False``, so pytest does not collect them where they are imported.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from dualtrain.errors import bad_argument
from dualtrain.validate import check_finite
from dualtrain_torch.compat.torchmb.base import AbstractBatchModule
from dualtrain_torch.compat.torchmb.batch import BatchModule
from dualtrain_torch.compat.torchmb.functional import merge_batch, split_batch
from dualtrain_torch.compat.torchmb.types import Size, StateDict

__all__ = ["assert_all_close", "test_batched_model", "test_model_batching"]


def assert_all_close(
    a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-6, atol: float = 1e-6
) -> None:
    """Raises AssertionError unless `a` and `b` have one shape and agree elementwise.

    Agreement is ``torch.allclose(a, b, rtol, atol, equal_nan=True)``, after promoting both to
    a common dtype. torchmb's returned its message instead of raising it.
    """
    if tuple(a.shape) != tuple(b.shape):
        raise AssertionError(f"shapes differ: {tuple(a.shape)} != {tuple(b.shape)}")
    dtype = torch.promote_types(a.dtype, b.dtype)
    a, b = a.to(dtype), b.to(dtype)
    if not torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
        gap = float((a - b).abs().nan_to_num(0.0).max())
        scale = float(b.abs().nan_to_num(0.0).max())
        raise AssertionError(
            f"values differ: max |a - b| = {gap:.3g}, beyond atol={atol:g} + rtol={rtol:g} * "
            f"|b| (max |b| = {scale:.3g})"
        )


def _shapes(input_shapes: object) -> list[tuple[int, ...]]:
    expected = "a sequence of input shapes, one per input, e.g. [(8, 3, 32, 32)]"
    if not isinstance(input_shapes, Sequence) or isinstance(input_shapes, (str, bytes)):
        raise bad_argument("input_shapes", input_shapes, expected)
    out = []
    for shape in input_shapes:
        if not isinstance(shape, Sequence) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
        ):
            raise bad_argument("input_shapes", input_shapes, expected)
        out.append(tuple(shape))
    if not out:
        raise bad_argument("input_shapes", input_shapes, expected)
    return out


def _drawn_like(value: torch.Tensor) -> torch.Tensor:
    """A random tensor with `value`'s norm (and sign, where `value` has no negative entry)."""
    if not value.is_floating_point() or value.numel() == 0:
        return value.clone()
    r = torch.randn_like(value)
    if not (value < 0).any():
        r = r.abs()  # a variance stays a variance
    norm = r.norm()
    return r * (value.norm() / norm) if norm > 0 else r


def _member_states(batched_model: AbstractBatchModule, randomize: bool) -> list[StateDict]:
    states = [{k: v.clone() for k, v in s.items()} for s in batched_model.state_dicts()]
    if not randomize:
        return states
    shared = set(batched_model.shared_buffers)
    return [{k: v if k in shared else _drawn_like(v) for k, v in s.items()} for s in states]


def _call(batched_model: AbstractBatchModule, inputs: list[torch.Tensor]) -> Any:
    """The batched model's outputs ``[G, B, ...]`` for inputs ``[G, B, ...]``."""
    if isinstance(batched_model, BatchModule):
        return batched_model(*inputs)
    # Any other batch module takes and returns merged (b g) rows.
    out = batched_model(*(merge_batch(x) for x in inputs))
    return pytree.tree_map(
        lambda t: split_batch(t, batched_model.batch) if isinstance(t, torch.Tensor) else t, out
    )


def test_batched_model(
    batched_model: AbstractBatchModule,
    model: nn.Module,
    input_shapes: Sequence[Size],
    rtol: float = 1e-6,
    atol: float = 1e-6,
    randomize: bool = True,
    restore_state: bool = True,
) -> None:
    """Checks that member g of `batched_model` computes what `model` computes with its weights.

    In eval mode, on random inputs ``[G, *shape]`` for each shape in `input_shapes`: with
    `randomize`, each member first gets weights of its own (random, each tensor with the
    norm it had); member g's outputs must then match ``model``'s with member g's state
    loaded, within `rtol` and `atol`. A `BatchModule` is called on ``[G, B, ...]`` inputs,
    any other batch module (a layer) on merged ``(b g)`` rows.

    Args:
        batched_model: the batched model (G = ``batched_model.batch`` members).
        model: the plain model, of the members' architecture; its state is overwritten
            during the check.
        input_shapes: one shape per input, without the member dimension.
        rtol: the relative tolerance (torchmb's default).
        atol: the absolute tolerance (torchmb's default).
        randomize: give each member random weights first.
        restore_state: put both models' states and modes back afterwards (also when the
            check fails).

    Raises:
        AssertionError: a member's output differs, naming the member and the output.
        ArgumentError: a bad argument.
    """
    if not isinstance(batched_model, AbstractBatchModule):
        raise bad_argument("batched_model", batched_model, "an AbstractBatchModule")
    if not isinstance(model, nn.Module):
        raise bad_argument("model", model, "a torch nn.Module")
    shapes = _shapes(input_shapes)
    rtol = check_finite("rtol", rtol, low=0)
    atol = check_finite("atol", atol, low=0)
    saved = None
    if restore_state:
        saved = (
            model.training,
            batched_model.training,
            copy.deepcopy(model.state_dict()),
            [{k: v.clone() for k, v in s.items()} for s in batched_model.state_dicts()],
        )
    try:
        model.eval()
        batched_model.eval()
        states = _member_states(batched_model, randomize)
        if randomize:
            batched_model.load_state_dicts(states)
        _compare(batched_model, model, shapes, states, rtol, atol)
    finally:
        if saved is not None:
            model.train(saved[0])
            batched_model.train(saved[1])
            model.load_state_dict(saved[2])
            batched_model.load_state_dicts(saved[3])


def _compare(
    batched_model: AbstractBatchModule,
    model: nn.Module,
    shapes: list[tuple[int, ...]],
    states: list[StateDict],
    rtol: float,
    atol: float,
) -> None:
    like = next((t for t in model.state_dict().values() if t.is_floating_point()), None)
    device = like.device if like is not None else torch.device("cpu")
    dtype = like.dtype if like is not None else torch.get_default_dtype()
    g = batched_model.batch
    inputs = [torch.randn((g, *shape), device=device, dtype=dtype) for shape in shapes]
    with torch.no_grad():
        got = pytree.tree_leaves(_call(batched_model, inputs))
        for i in range(g):
            model.load_state_dict(states[i])
            want = pytree.tree_leaves(model(*(x[i] for x in inputs)))
            if len(want) != len(got):
                raise AssertionError(
                    f"the batched model gave {len(got)} outputs, the plain model {len(want)}"
                )
            for j, (mine, theirs) in enumerate(zip(got, want, strict=True)):
                try:
                    assert_all_close(mine[i], theirs, rtol, atol)
                except AssertionError as e:
                    raise AssertionError(
                        f"member {i}'s output {j} differs from the plain model's with member "
                        f"{i}'s state: {e}"
                    ) from None


def test_model_batching(
    model: nn.Module,
    input_shapes: Sequence[Size],
    batch: int = 3,
    rtol: float = 1e-6,
    atol: float = 1e-6,
) -> None:
    """``BatchModule(model, batch)`` checked by `test_batched_model` (torchmb's one-liner).

    Raises:
        AssertionError: a member differs from the plain model with its weights.
        ArgumentError: a bad argument.
    """
    test_batched_model(BatchModule(model, batch), model, input_shapes, rtol, atol)


# Helpers, not tests: a test module that imports them must not have pytest collect them.
test_batched_model.__test__ = False  # type: ignore[attr-defined]
test_model_batching.__test__ = False  # type: ignore[attr-defined]
