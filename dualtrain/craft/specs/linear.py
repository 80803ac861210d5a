"""Dense and Embedding: the layers that map features and ids through one weight matrix."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from dualtrain.craft.checks import check_ids, concrete
from dualtrain.craft.params import ParamSpec
from dualtrain.craft.specs.base import Layer, flags, positive
from dualtrain.errors import DtypeError, ShapeError

__all__ = ["Dense", "Embedding"]


@dataclasses.dataclass(frozen=True, eq=False)
class Dense(Layer):
    """``y = x @ weight.T + bias`` over the last axis: ``(..., in) -> (..., out)``."""

    input_dtypes = "params"  # see dualtrain.craft.checks.check_dtype

    in_features: int
    out_features: int
    bias: bool = True

    def __post_init__(self) -> None:
        positive(self, "in_features", "out_features")
        flags(self, "bias")

    def params(self) -> dict[str, ParamSpec]:
        bound = 1 / math.sqrt(self.in_features)
        out = {"weight": ParamSpec((self.out_features, self.in_features), "uniform", bound)}
        if self.bias:
            out["bias"] = ParamSpec((self.out_features,), "uniform", bound)
        return out

    def check_input(self, x: Any, *rest: Any, train: bool = False, **kwargs: Any) -> None:
        """Takes ``(..., in_features)``."""
        shape = tuple(x.shape)
        if not shape or shape[-1] != self.in_features:
            raise ShapeError(f"Dense takes (..., {self.in_features}); got shape {shape}")


@dataclasses.dataclass(frozen=True, eq=False)
class Embedding(Layer):
    """Looks rows up: int ids ``(...)`` -> ``(..., dim)``."""

    by_signature: ClassVar[bool] = False  # concrete ids are checked, each call
    num_embeddings: int
    dim: int

    def __post_init__(self) -> None:
        positive(self, "num_embeddings", "dim")

    def params(self) -> dict[str, ParamSpec]:
        return {"weight": ParamSpec((self.num_embeddings, self.dim), "normal", 1.0)}

    def check_input(self, x: Any, *rest: Any, train: bool = False, **kwargs: Any) -> None:
        """Takes integer ids; concrete ones must lie in ``[0, num_embeddings)``.

        Traced ids (under ``jax.jit`` or ``torch.compile``) are not read: JAX then gives a
        row of NaN for an id out of range, never another row. Under ``torch.func``
        transforms (a vmapped BatchModule) every member's ids are read and checked.
        """
        dtype = str(x.dtype).removeprefix("torch.")
        if not dtype.startswith(("int", "uint")):
            raise DtypeError(f"Embedding takes integer ids; got dtype {dtype}")
        ids = concrete(x)
        if ids is not None:
            check_ids(ids, self.num_embeddings, "Embedding ids")
