"""Optimizer state in an anchor: native (same framework) and neutral (across frameworks).

`TimeMachine.drop` writes an optimizer's state in its framework's **native** form: any
``torch.optim`` optimizer as its ``state_dict()`` keyed by parameter name, any optax state as
its pytree with the structure recorded (``dualtrain_torch.optimizer_state`` and
``dualtrain_jax.optimizer_state``). Nothing is pickled: tensors go to the file, the rest to
the manifest's JSON. An optimizer whose state cannot be written that way is refused by name
before anything is written.

Beside it, the writer records the state's **neutral** view (one of the families below, its
slots naming the native tensors, which are not stored twice), or why it has none. A load
under the same framework uses the native form; under the other one, the neutral view or a
`CheckpointError` saying why the optimizer cannot cross.

=======  ======================================  =========================  ====================
family   slots (per parameter, canonical layout)  torch                      optax
=======  ======================================  =========================  ====================
sgd      momentum_buffer (with momentum)          SGD                        sgd (TraceState)
adam     exp_avg, exp_avg_sq; step                Adam, AdamW                adam, adamw
rmsprop  square_avg, grad_avg (centered),         RMSprop                    rmsprop(eps_in_sqrt
         momentum_buffer (momentum)                                          =False)
adagrad  sum                                      Adagrad                    adagrad
=======  ======================================  =========================  ====================

Slot names are torch's state keys. Anchors written before the native form (a manifest entry
``{family, step, hyper}`` and tensors ``optimizer.<slot>.<name>``) load as neutral state.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from dualtrain.checkpoint.fit import in_scope
from dualtrain.checkpoint.vocabulary import slot_name
from dualtrain.errors import ArgumentError, CheckpointError, DualtrainError

__all__ = [
    "FAMILIES",
    "VARIANTS",
    "NotPortableError",
    "OptimizerState",
    "check_optimizer",
    "check_scheduler",
    "optimizer_tensor_names",
    "record_optimizer",
    "record_scheduler",
    "scheduler_tensor_names",
]

FAMILIES = {
    "sgd": ("momentum_buffer",),
    "adam": ("exp_avg", "exp_avg_sq"),
    "rmsprop": ("square_avg", "grad_avg", "momentum_buffer"),
    "adagrad": ("sum",),
}
# Structural choices that change which slots exist and what the update does: they must
# agree between the anchor and the optimizer that resumes (values such as lr need not).
VARIANTS = {
    "sgd": ("momentum",),
    "adam": (),
    "rmsprop": ("centered", "momentum"),
    "adagrad": (),
}


class NotPortableError(DualtrainError, TypeError):
    """An optimizer (or its state) has no neutral form, so it cannot cross frameworks."""


@dataclasses.dataclass
class OptimizerState:
    """An optimizer's state in neutral form.

    Attributes:
        family: ``"sgd"``, ``"adam"``, ``"rmsprop"`` or ``"adagrad"``.
        step: updates taken so far (Adam's bias correction needs it; 0 where unknown).
        slots: ``{slot: {parameter name: array (canonical layout)}}``; a parameter the
            optimizer has not stepped yet may be absent.
        hyper: hyper-parameters as recorded by the producer (``lr``, ``betas``, ...).
        variant: the family's structural flags (`VARIANTS`), e.g. ``{"momentum": True}``;
            a flag that is absent is unknown (anchors of an older format).
        lrs: learning rate per parameter at the time of writing (torch's RMSprop with
            momentum: optax keeps that buffer multiplied by ``-lr``).
        lr_folded: the ``momentum_buffer`` slot holds optax's form (``-lr`` times torch's).
    """

    family: str
    step: int
    slots: dict[str, dict[str, Any]]
    hyper: dict[str, Any] = dataclasses.field(default_factory=dict)
    variant: dict[str, bool] = dataclasses.field(default_factory=dict)
    lrs: dict[str, float] = dataclasses.field(default_factory=dict)
    lr_folded: bool = False

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(
                f"optimizer family must be one of {sorted(FAMILIES)}; got {self.family!r}"
            )
        unknown = set(self.slots) - set(FAMILIES[self.family])
        if unknown:
            raise ValueError(
                f"{self.family} state has slots {list(FAMILIES[self.family])}; "
                f"got {sorted(unknown)}"
            )
        for slot in FAMILIES[self.family]:
            self.slots.setdefault(slot, {})

    def tensors(self) -> dict[str, Any]:
        """The slots flattened for a checkpoint: ``optimizer.<slot>.<parameter name>``."""
        return {
            f"optimizer.{slot}.{name}": value
            for slot, values in self.slots.items()
            for name, value in values.items()
        }

    @classmethod
    def from_tensors(
        cls, family: str, step: int, hyper: dict[str, Any], tensors: dict[str, Any]
    ) -> OptimizerState:
        """The inverse of `tensors`, given the manifest's family, step and hyper-parameters."""
        slots: dict[str, dict[str, Any]] = {}
        for key, value in tensors.items():
            _, slot, name = key.split(".", 2)
            slots.setdefault(slot_name(slot), {})[name] = value  # "momentum": /1's name
        variant = {}
        if family == "sgd" and slots.get("momentum_buffer"):
            variant["momentum"] = True  # an old anchor says nothing when there are no buffers
        return cls(family, step, slots, hyper, variant)

    def describe(self, keep: Callable[[str], bool], stored: dict[str, Any]) -> dict[str, Any]:
        """This view for the manifest; slots hold tensor names, kept if `stored` has them."""
        return {
            "family": self.family,
            "step": int(self.step),
            "hyper": self.hyper,
            "variant": self.variant,
            "lrs": {k: float(v) for k, v in self.lrs.items() if keep(k)},
            "lr_folded": self.lr_folded,
            "slots": {
                slot: {k: t for k, t in values.items() if keep(k) and t in stored}
                for slot, values in self.slots.items()
            },
        }

    def name_of(self) -> str:
        """How messages name this state: its family and variant."""
        flags = [k for k, v in self.variant.items() if v]
        return self.family + (f" ({', '.join(flags)})" if flags else "")

    def check_fits(self, family: str, variant: dict[str, bool], *, takes: str, has: str) -> None:
        """Refuses to load into an optimizer of another family or structural variant.

        Args:
            family: the family of the optimizer (or optax state) it would load into.
            variant: that optimizer's flags (`VARIANTS`); one absent on either side is not
                compared.
            takes: how the message says its family (``"torch.optim.SGD takes adam state"``).
            has: how the message leads into one of its flags (``"torch.optim.SGD here has"``).

        Raises:
            CheckpointError: ``it holds <this state> optimizer state; <takes>``, or ``...;
                <has> <flag>=<value>``.
        """
        if family != self.family:
            raise CheckpointError(f"it holds {self.name_of()} optimizer state; {takes}")
        for flag, value in self.variant.items():
            if flag in variant and variant[flag] != value:
                raise CheckpointError(
                    f"it holds {self.name_of()} optimizer state; {has} {flag}={variant[flag]}"
                )


# ---- writing ----------------------------------------------------------------------------


def record_optimizer(
    part: Any, craft: Any, optimizer: Any, scope: str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tensors and manifest entry of `optimizer`'s state, or an error naming it.

    `part` is the adapter's checkpoint module; only parameters in `scope` keep their state.
    Raises before anything is written: the caller writes the file afterwards.
    """
    keep = functools.partial(in_scope, scope=scope)
    entry, tensors = part.export_native(craft, optimizer, keep)
    entry = {"form": "native", "framework": craft.dualtrain_backend, **entry}
    try:
        view = part.neutral_view(craft, optimizer)
    except NotPortableError as why:
        entry["neutral"], entry["crossing"] = None, str(why)
    else:
        entry["neutral"] = view.describe(keep, tensors)
    return tensors, entry


def record_scheduler(
    part: Any, craft: Any, scheduler: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tensors and manifest entry of a learning-rate scheduler (where the part has one)."""
    part.check_scheduler_support(scheduler, loading=False)
    entry, tensors = part.export_scheduler(scheduler)
    return tensors, {"framework": craft.dualtrain_backend, **entry}


# ---- reading ----------------------------------------------------------------------------


def optimizer_tensor_names(
    manifest: dict[str, Any], backend: str, loaded: set[str], path: Any
) -> list[str]:
    """The optimizer tensors `check_optimizer` needs for a craft of `backend`."""
    entry = _entry(manifest, path)
    try:
        if entry.get("form") != "native":  # written before the native form: neutral tensors
            names = [k for k in manifest.get("tensors", []) if k.startswith("optimizer.")]
        elif entry.get("framework") == backend:
            names = [
                name
                for name, info in entry.get("tensors", {}).items()
                if info.get("param") is None or info["param"] in loaded
            ]
        else:
            neutral = entry.get("neutral") or {}
            slots = neutral.get("slots", {}).values()
            names = sorted({str(t) for values in slots for t in values.values()})
    except (KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{path} has a malformed optimizer entry: {err!r}") from err
    return _listed(names, manifest, path, "optimizer")


def check_optimizer(
    part: Any,
    craft: Any,
    optimizer: Any,
    manifest: dict[str, Any],
    tensors: dict[str, Any],
    loaded: set[str],
    path: Any,
) -> Callable[[], Any]:
    """Validates the anchor's optimizer state against `optimizer`; changes nothing.

    Returns:
        A function that fills `optimizer` (torch: in place) and returns the result (optax:
        a new state). It is called once the model is loaded; it does not fail.

    Raises:
        CheckpointError: the state does not fit `optimizer`, or cannot cross to its
            framework; the message names the optimizer and why.
    """
    entry = _entry(manifest, path)
    backend = craft.dualtrain_backend
    try:
        if entry.get("form") != "native":
            state = _legacy(entry, tensors, path)
            return part.check_neutral(craft, optimizer, _only(state, loaded), loaded)
        tensors = _validated(entry.get("tensors", {}), tensors)
        if entry.get("framework") == backend:
            return part.check_native(craft, optimizer, entry, tensors, loaded)
        neutral = entry.get("neutral")
        if not neutral:
            raise CheckpointError(
                f"it holds {entry.get('framework')} optimizer state that cannot cross to "
                f"{backend}: {entry.get('crossing', 'it has no neutral form')}"
            )
        state = _neutral(neutral, tensors)
        return part.check_neutral(craft, optimizer, _only(state, loaded), loaded)
    except NotPortableError as why:
        raise CheckpointError(f"{path}: {why}") from why
    except CheckpointError as err:
        raise CheckpointError(f"{path}: {err}") from err
    except ArgumentError:  # the caller's own argument, not the file: said as it is
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
        raise CheckpointError(f"{path} has a malformed optimizer entry: {err!r}") from err


def scheduler_tensor_names(manifest: dict[str, Any], path: Any) -> list[str]:
    """The scheduler tensors `check_scheduler` needs."""
    entry = manifest.get("scheduler")
    if not isinstance(entry, dict):
        raise CheckpointError(f"{path} holds no scheduler state; it was dropped without one")
    tensors = entry.get("tensors", {})
    if not isinstance(tensors, dict):
        raise CheckpointError(f"{path} has a malformed scheduler entry: 'tensors' is {tensors!r}")
    return _listed(sorted(tensors), manifest, path, "scheduler")


def _listed(names: list[str], manifest: dict[str, Any], path: Any, what: str) -> list[str]:
    """`names`, each checked to be one of the file's tensors (the manifest lists them)."""
    listed = set(manifest.get("tensors", []))
    missing = [name for name in names if name not in listed]
    if missing:
        raise CheckpointError(
            f"{path} has a malformed {what} entry: it names tensors the file lacks, {missing[:3]}"
        )
    return names


def check_scheduler(
    part: Any,
    scheduler: Any,
    manifest: dict[str, Any],
    tensors: dict[str, Any],
    path: Any,
) -> Callable[[], Any]:
    """Validates the anchor's scheduler state against `scheduler`; returns its loader."""
    entry = manifest["scheduler"]
    try:
        part.check_scheduler_support(scheduler, loading=True)
        tensors = _validated(entry.get("tensors", {}), tensors)
        return part.check_scheduler(scheduler, entry, tensors)
    except CheckpointError as err:
        raise CheckpointError(f"{path}: {err}") from err
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
        raise CheckpointError(f"{path} has a malformed scheduler entry: {err!r}") from err


def _entry(manifest: dict[str, Any], path: Any) -> dict[str, Any]:
    entry = manifest.get("optimizer")
    if entry is None:
        raise CheckpointError(f"{path} holds no optimizer state; it was dropped without one")
    if not isinstance(entry, dict):
        raise CheckpointError(f"{path} has a malformed optimizer entry: {entry!r}")
    return entry


def _legacy(entry: dict[str, Any], tensors: dict[str, Any], path: Any) -> OptimizerState:
    try:
        return OptimizerState.from_tensors(
            entry["family"], int(entry["step"]), dict(entry.get("hyper", {})), tensors
        )
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{path} has a malformed optimizer entry: {err}") from err


def _neutral(neutral: dict[str, Any], tensors: dict[str, Any]) -> OptimizerState:
    slots = {
        slot: {k: tensors[t] for k, t in values.items()}
        for slot, values in neutral.get("slots", {}).items()
    }
    return OptimizerState(
        neutral["family"],
        int(neutral.get("step", 0)),
        slots,
        dict(neutral.get("hyper", {})),
        dict(neutral.get("variant", {})),
        dict(neutral.get("lrs", {})),
        bool(neutral.get("lr_folded", False)),
    )


def _only(state: OptimizerState, loaded: set[str]) -> OptimizerState:
    """Slots of the parameters `to` loads: a skipped parameter keeps its optimizer state."""
    slots = {
        s: {k: v for k, v in values.items() if k in loaded} for s, values in state.slots.items()
    }
    return dataclasses.replace(state, slots=slots)


def _validated(expected: dict[str, dict[str, Any]], tensors: dict[str, Any]) -> dict[str, Any]:
    """`tensors` checked against their manifest shapes and dtypes (0-d ones reshaped back)."""
    out = {}
    for name, value in tensors.items():
        info = expected.get(name)
        if info is None:
            out[name] = value
            continue
        shape = tuple(info["shape"])
        if tuple(value.shape) != shape:
            # safetensors stores a 0-d tensor as (1,); the manifest keeps the true shape.
            if shape == () and tuple(value.shape) == (1,):
                value = value.reshape(())
            else:
                raise CheckpointError(
                    f"tensor {name} is {tuple(value.shape)} on disk but {shape} in the manifest"
                )
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype != info["dtype"]:
            raise CheckpointError(
                f"tensor {name} is {dtype} on disk but {info['dtype']} in the manifest"
            )
        out[name] = value
    return out
