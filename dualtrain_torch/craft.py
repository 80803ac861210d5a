"""A Craft realized as a torch ``nn.Module``, and the training contexts around it."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from dualtrain.craft import Craft, binding, checks, dock
from dualtrain.craft.craft import is_torch_module
from dualtrain.craft.realizable import check_realizable
from dualtrain.deprecation import positional_deprecated
from dualtrain.dtypes import name_of
from dualtrain.errors import DtypeError, ShapeError, bad_argument
from dualtrain.interop import convert
from dualtrain.validate import check_float_dtype
from dualtrain_torch.layers import build
from dualtrain_torch.transfer import parse_device

__all__ = ["CraftModule", "Nozzle", "Prober", "Rudder", "coat", "realize", "shell"]


class _LayerTable:
    """Which module runs each part of a Craft: one table shared by its nested CraftModules.

    Parts are looked up by identity (dock specs are hashed by identity; lists and dicts are
    not hashable). A deep copy or pickle of a realized module copies the Craft's layers with
    new ids, so the table keeps its (part, module) pairs and rebuilds the ids from them.
    """

    def __init__(self) -> None:
        self.pairs: list[tuple[Any, nn.Module]] = []
        self._ids: dict[int, nn.Module] = {}
        # Calls whose input checks passed: (layer id, training, input shape and dtype), for
        # inputs of the layer weight's dtype. The checks read shapes and dtypes only (but
        # Embedding's, which reads ids), so they run once per input signature, not per call.
        self.checked: set[tuple[Any, ...]] = set()

    def get(self, part: Any) -> nn.Module | None:
        return self._ids.get(id(part))

    def add(self, part: Any, module: nn.Module) -> None:
        self.pairs.append((part, module))
        self._ids[id(part)] = module

    def __getstate__(self) -> list[tuple[Any, nn.Module]]:
        return self.pairs

    def __setstate__(self, pairs: list[tuple[Any, nn.Module]]) -> None:
        self.pairs, self._ids = pairs, {id(part): module for part, module in pairs}
        self.checked = set()

    def __deepcopy__(self, memo: dict[int, Any]) -> _LayerTable:
        new = memo[id(self)] = _LayerTable()  # nested CraftModules refer back to it
        new.__setstate__(copy.deepcopy(self.pairs, memo))
        return new


_CHECKED_KEPT = 4096  # checked call signatures kept per realized Craft
# Read on every layer call: bound once.
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling


class _TorchBinding:
    __slots__ = ("modules",)

    def __init__(self, modules: _LayerTable) -> None:
        self.modules = modules

    def layer(self, layer: Any, *inputs: Any, **kwargs: Any) -> Any:
        module = self.modules.get(layer)
        if module is None:
            raise binding.NotRealizedError(
                f"a {type(layer).__name__} layer was called that is not an attribute of the "
                "Craft being run; assign layers in __init__ so they are named and realized"
            )
        if not inputs:
            return module(*inputs, **kwargs)
        weight = module._parameters.get("weight")  # not nn.Module.__getattr__: slower
        x = inputs[0]
        key = None
        # Remembered only for an input of the weight's own dtype (what every dtype rule
        # takes, autocast or not), never while torch.compile traces (the set would become
        # one of its guards).
        if (
            type(x) is _Tensor
            and weight is not None
            and len(inputs) == 1
            and not kwargs
            and layer.by_signature
            and not _is_compiling()
        ):
            dtype = x.dtype
            if dtype is weight.dtype:
                key = (id(layer), module.training, x.shape, dtype)
                if key in self.modules.checked:
                    return module(x)
        # Under an export's trace sizes are tensors, and this call's inputs were checked
        # when it ran eagerly (the ladder exports a signature it has run).
        if not torch.jit.is_tracing():
            layer.check_input(*inputs, train=module.training, **kwargs)
            # An input of the weight's own dtype is what every "params" rule takes (under
            # autocast too): skipped, as this runs on every layer call.
            same = weight is not None and x.dtype == weight.dtype
            if not (same and layer.input_dtypes == "params"):
                dtype = checks.params_dtype(layer, lambda local: getattr(module, local, None))
                layer.check_dtype(x, dtype, train=module.training)
            if key is not None:
                if len(self.modules.checked) >= _CHECKED_KEPT:
                    self.modules.checked.clear()
                self.modules.checked.add(key)
        return module(*inputs, **kwargs)

    def native(self, obj: Any, *inputs: Any, **kwargs: Any) -> Any:
        return obj.fn(*inputs, **kwargs)


class CraftModule(nn.Module):
    """An ``nn.Module`` whose ``forward`` is the Craft's ``run``.

    Submodules mirror the Craft's attributes (child Crafts, lists, dicts, Sequential), so the
    ``state_dict`` keys are the neutral names (``block.0.weight``) and its tensors are in the
    canonical layouts, so a ``state_dict`` is a checkpoint's content as it is.
    """

    dualtrain_backend = "torch"

    def __init__(self, craft: Craft, modules: _LayerTable) -> None:
        super().__init__()
        self.craft = craft
        self._layer_modules = modules
        self.__dict__["_binding"] = _TorchBinding(modules)  # what runs its layers
        craft.param_specs()  # refuses names that cannot be parameter names, as JAX does
        for name, part in craft.parts().items():
            # Straight into _modules: add_module refuses names that are nn.Module attributes
            # ("train", "forward", "craft"), which JAX and the checkpoints accept.
            self._modules[name] = _module_for(part, modules)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        # Made in __init__ (a forward changes no attribute: the ladder checks that).
        bound = self.__dict__.get("_binding")
        if bound is None or bound.modules is not self._layer_modules:
            bound = _TorchBinding(self._layer_modules)
        return binding.run_bound(bound, self.craft.run, *inputs, **kwargs)

    def extra_repr(self) -> str:
        return f"craft={type(self.craft).__name__}, scope={self.craft.scope!r}"

    def gear(self, gear: Any) -> CraftModule:
        """Nebulae's ``gear``: an Engine or device moves the module there, in place.

        True / False set training / evaluation mode instead. Returns the module.
        """
        if isinstance(gear, (bool, np.bool_)):
            return self.train(bool(gear))
        return self.to(parse_device(gear))


def _module_for(part: Any, modules: _LayerTable) -> nn.Module:
    known = modules.get(part)
    if known is not None:  # a layer used twice is one module: tied weights
        return known
    if isinstance(part, Craft):
        # A Craft that owns its realized module (Nebulae compat's, which realizes itself
        # when first used) takes part as that module, so one set of weights serves it
        # wherever it is held.
        own = getattr(type(part), "__realized__", None)
        out: nn.Module = own(part) if own is not None else CraftModule(part, modules)
    elif isinstance(part, dock.Sequential):
        out = nn.ModuleList([_module_for(p, modules) for p in part.layers])
    elif isinstance(part, (list, tuple)):
        out = nn.ModuleList([_module_for(p, modules) for p in part])
    elif isinstance(part, dict):
        out = nn.ModuleDict()
        for key, value in part.items():  # keys like "train" or "keys": see CraftModule
            out._modules[key] = _module_for(value, modules)
    elif is_torch_module(part):
        out = part
    elif isinstance(part, dock.Native):
        out = nn.Identity()  # holds no parameters; the binding calls its function
    else:
        out = build(part)
    modules.add(part, out)
    return out


@positional_deprecated("dualtrain_torch.realize", ("seed", "device", "dtype"))
def realize(craft: Craft, *, seed: int = 0, device: Any = None, dtype: Any = None) -> CraftModule:
    """The Craft as a torch module, initialized like `dualtrain_jax.realize` for the seed.

    Args:
        craft: the model description.
        seed: initialization seed, an int in [0, 2**64); the same seed gives the same
            weights under JAX.
        device: where the module lives (``"cpu"``, ``"cuda:0"``, a `dualtrain.Engine`);
            default the Engine the Craft was geared to (``craft.gear(engine)``), else CPU.
        dtype: floating dtype of parameters and state (float16, bfloat16, float32, float64);
            None means float32.

    Positional `seed`, `device`, `dtype` (the previous release's order) still work with a
    ``DeprecationWarning``; they become keyword-only in the next release.

    Raises:
        TypeError: the Craft holds a JAX-native layer (the message names it).
        ArgumentError: a bad seed, or a layer name that cannot be a parameter name.
        DtypeError: a dtype that is not floating.
    """
    check_realizable(craft, "torch")
    dtype = "float32" if dtype is None else dtype
    values = craft.init(seed, dtype)  # checks seed, dtype and names before building
    module = CraftModule(craft, _LayerTable()).to(
        dtype=getattr(torch, check_float_dtype("dtype", dtype).name)
    )
    load_canonical(module, values)
    if device is None:
        device = craft.geared
    return module.to(parse_device(device)) if device is not None else module


def load_canonical(module: CraftModule, tensors: dict[str, Any]) -> None:
    """Copies canonical arrays (NumPy or torch) into the module's parameters and buffers.

    One ``copy_`` per tensor, which also casts the dtype and moves it to the module's device.
    Every name and shape is checked before the first copy; a shape is never broadcast
    (``(1,)`` does not fill ``(16,)``).
    """
    targets: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
    targets.update(module.named_buffers(remove_duplicate=False))
    sources = {}
    for name, value in tensors.items():
        if name not in targets:
            raise ShapeError(f"{name} is not a parameter or buffer of this module")
        source = value if isinstance(value, torch.Tensor) else convert(value, to="torch")
        if tuple(source.shape) != tuple(targets[name].shape):
            raise ShapeError(
                f"{name} is {tuple(source.shape)} in the values given but "
                f"{tuple(targets[name].shape)} in the module"
            )
        sources[name] = source
    with torch.no_grad():
        for name, source in sources.items():
            targets[name].copy_(source)


class _Mode:
    """Shared body of the three contexts: a grad mode plus train/eval for the modules."""

    grad: bool
    train: bool

    def __init__(self, *modules: nn.Module) -> None:
        self.modules = modules
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> bool:
        self._saved = [m.training for m in self.modules]
        for m in self.modules:
            m.train(self.train)
        self._stack.enter_context(torch.enable_grad() if self.grad else torch.no_grad())
        return self.train

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        for m, was in zip(self.modules, self._saved, strict=True):
            m.train(was)


class Rudder(_Mode):
    """Training: gradients on, modules in train mode (``with Rudder(net): loss.backward()``)."""

    grad, train = True, True


class Prober(_Mode):
    """Inspection: gradients on, modules in eval mode; parameters are left to you unchanged."""

    grad, train = True, False


class Nozzle(_Mode):
    """Inference: gradients off, modules in eval mode."""

    grad, train = False, False


def coat(datum: Any, as_const: bool = True, device: Any = None, dtype: Any = None) -> torch.Tensor:
    """Any number, list or array as a tensor on `device`; trainable when ``as_const=False``.

    Nebulae's ``coat(datum, as_const=True)``, with `device` and `dtype` added (Nebulae took
    the device from its Engine).

    Args:
        datum: a Python number or list, a NumPy/JAX/torch array.
        as_const: False gives a new leaf tensor that requires grad (a copy).
        device: where the tensor goes; default where it is (CPU for new ones).
        dtype: the dtype to cast to (``"float32"``, ``np.float32``, ``torch.float32``).

    Raises:
        ArgumentError: `as_const` is not a bool.
        DtypeError: ``as_const=False`` for a tensor that is not floating (nothing
            integral or boolean can have a gradient).
    """
    if not isinstance(as_const, (bool, np.bool_)):
        raise bad_argument("as_const", as_const, "a bool")
    if isinstance(datum, torch.Tensor):
        t = datum
    elif isinstance(datum, (int, float, bool, complex, list, tuple)):
        t = torch.tensor(datum)  # torch's defaults for Python numbers: float32, int64
    else:
        t = convert(datum, to="torch")  # arrays (and NumPy scalars) keep their dtype
    if dtype is not None:
        t = t.to(dtype if isinstance(dtype, torch.dtype) else getattr(torch, name_of(dtype)))
    if not as_const and not (t.is_floating_point() or t.is_complex()):
        raise DtypeError(
            f"coat(as_const=False) makes a trainable tensor, which must be floating; got "
            f"{name_of(t.dtype)} (pass dtype='float32' or a float datum)"
        )
    if device is not None:
        t = t.to(parse_device(device))
    if not as_const:
        t = t.detach().clone().requires_grad_(True)
    return t


def shell(datum: Any, as_np: bool = True) -> Any:
    """A tensor (or pytree of them) back as NumPy (``as_np``) or a detached CPU tensor."""
    if as_np:
        out = convert(datum, to="numpy")  # device arrays are fetched to the host (a copy)
        return out.item() if isinstance(out, np.ndarray) and out.shape == () else out
    return datum.detach().cpu()
