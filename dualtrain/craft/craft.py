"""Craft: the neutral model base class.

Subclass it, assign dock layers (and child Crafts, lists and dicts of them) in ``__init__``,
and write ``run(self, *inputs)``. A Craft holds no arrays: realize it under a backend to get
a torch ``nn.Module`` or a JAX module, both keyed by the same parameter names.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from dualtrain.craft import binding
from dualtrain.craft.params import ParamSpec, initial_value, join
from dualtrain.craft.specs.base import Layer
from dualtrain.craft.specs.containers import Native, Sequential
from dualtrain.errors import bad_argument
from dualtrain.validate import check_float_dtype, check_seed

__all__ = ["Craft", "is_torch_module"]


def is_torch_module(value: object) -> bool:
    """Whether `value` is a torch ``nn.Module``, checked without importing torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.nn.Module)


def _is_part(value: object) -> bool:
    if isinstance(value, (Layer, Craft)) or is_torch_module(value):
        return True
    if isinstance(value, (list, tuple)):
        return bool(value) and all(_is_part(v) for v in value)
    if isinstance(value, dict):
        return bool(value) and all(isinstance(k, str) and _is_part(v) for k, v in value.items())
    return False


class Craft:
    """A model written once for every backend.

    Example:
        >>> class Net(Craft):
        ...     def __init__(self, nclass):
        ...         super().__init__("NET")
        ...         self.fc = dock.Dense(16, nclass)
        ...     def run(self, x):
        ...         return self.fc(dock.relu(x))

    Args:
        scope: a label for the model, recorded in checkpoints.
    """

    def __init__(self, scope: str = "") -> None:
        if not isinstance(scope, str):
            raise bad_argument("scope", scope, "a str")
        object.__setattr__(self, "_scope", scope)

    def __setattr__(self, name: str, value: Any) -> None:
        parts = self.__dict__.setdefault("_parts", {})
        if not name.startswith("_") and _is_part(value):
            parts[name] = value
        else:
            parts.pop(name, None)
        object.__setattr__(self, name, value)

    @property
    def scope(self) -> str:
        """The model's label."""
        return self.__dict__.get("_scope", "")

    def gear(self, engine: Any) -> Craft:
        """Nebulae's ``net.gear(engine)``: `realize` places the model on `engine`'s device.

        Args:
            engine: a `dualtrain.Engine` or a device (``"cuda:0"``, a torch or JAX device);
                None forgets it. Realized modules have a `gear` of their own, which moves
                them.

        Returns:
            The Craft.
        """
        if isinstance(engine, bool):
            raise bad_argument(
                "engine",
                engine,
                "an Engine or a device; gear(True/False) sets the mode of a realized module",
            )
        object.__setattr__(self, "_geared", engine)
        return self

    @property
    def geared(self) -> Any:
        """The Engine or device given to `gear` (None if none)."""
        return self.__dict__.get("_geared")

    def run(self, *inputs: Any) -> Any:
        """The forward computation; subclasses write it with dock layers and ops."""
        raise NotImplementedError(f"{type(self).__name__} must define run(self, *inputs)")

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        binding.current(type(self).__name__)  # a Craft runs only inside a realized module
        return self.run(*inputs, **kwargs)

    def parts(self) -> dict[str, Any]:
        """The registered layers, child Crafts, containers and native modules, in order."""
        return dict(self.__dict__.get("_parts", {}))

    def named_layers(self, prefix: str = "") -> Iterator[tuple[str, Any]]:
        """Every dock layer and native module in the tree, with its dotted name.

        A layer used in two places is yielded twice: the first name is the one its
        parameters take.
        """
        for name, part in self.parts().items():
            yield from _walk(join(prefix, _part_name(name, prefix)), part)

    def param_specs(self) -> dict[str, ParamSpec]:
        """Every parameter and state tensor, by neutral name (``block.0.weight``)."""
        specs: dict[str, ParamSpec] = {}
        seen: set[int] = set()
        for name, layer in self.named_layers():
            if id(layer) in seen or not isinstance(layer, Layer):
                continue
            seen.add(id(layer))
            for local, spec in layer.params().items():
                specs[join(name, local)] = spec
        return specs

    def init(self, seed: int = 0, dtype: Any = "float32") -> dict[str, Any]:
        """Initial parameters and state as NumPy arrays by name: the same on every backend.

        Args:
            seed: an int in [0, 2**64) (NumPy ints too); each parameter draws from its own
                (seed, name) stream, so distinct seeds give distinct weights.
            dtype: floating dtype of the arrays: float16, bfloat16, float32 or float64.

        Raises:
            ArgumentError: `seed` is not an int in range (bools and floats included).
            DtypeError: `dtype` is not a floating dtype (integer weights would all be 0).
        """
        seed = check_seed("seed", seed)
        dtype = check_float_dtype("dtype", dtype)
        return {
            name: initial_value(spec, name, seed, dtype)
            for name, spec in self.param_specs().items()
        }

    def layer_names(self) -> dict[int, str]:
        """``id(layer) -> name`` of each layer's first place (tied layers share one name)."""
        names: dict[int, str] = {}
        for name, layer in self.named_layers():
            names.setdefault(id(layer), name)
        return names

    def natives(self) -> list[tuple[str, Any]]:
        """The framework-native parts, with their names: torch modules and `dock.Native`."""
        return [
            (name, layer)
            for name, layer in self.named_layers()
            if isinstance(layer, Native) or is_torch_module(layer)
        ]


def _part_name(name: str, parent: str) -> str:
    """`name` (an attribute or dict key) if it can be one segment of a parameter name.

    A dot would make two layers' names collide (``{"a.b": x}`` beside ``a = {"b": y}``)
    and an empty name would vanish from the path, so both are refused under every backend.
    """
    if not name or "." in name:
        where = f" in {parent!r}" if parent else ""
        raise bad_argument(
            "layer name", name, f"a non-empty name without '.' (a part{where} of the Craft)"
        )
    return name


def _walk(name: str, part: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(part, Craft):
        yield from part.named_layers(name)
    elif isinstance(part, Sequential):
        for i, layer in enumerate(part.layers):
            yield from _walk(join(name, i), layer)
    elif isinstance(part, (list, tuple)):
        for i, item in enumerate(part):
            yield from _walk(join(name, i), item)
    elif isinstance(part, dict):
        for key, item in part.items():
            yield from _walk(join(name, _part_name(key, name)), item)
    else:
        yield name, part
