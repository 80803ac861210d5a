"""Nebulae's ``Multiverse`` (``nebulae.cockpit.multiverse_pt``; the demos say ``neb.law``).

dualtrain's Multiverse under torch with Nebulae's calls: ``mv.Executor`` marks a step
function and changes nothing (Nebulae's did the same), and ``mv.sync(models, data)``
returns the synced models followed by the data, as one tuple.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, cast

from dualtrain.craft.craft import Craft
from dualtrain.errors import bad_argument
from dualtrain.multiverse.multiverse import Multiverse as _Multiverse, main_decorator

__all__ = ["Multiverse"]


class _Executor:
    """``mv.Executor``: Nebulae's step-function marker; ``Multiverse.Executor``: the main one.

    v0.5.15's code and demos decorate step functions with ``@mv.Executor`` (it runs them as
    they are); the brochure decorates the main function with ``@Multiverse.Executor``
    (`dualtrain.multiverse.main_decorator`). The instance and the class give each form.
    """

    def __get__(self, instance: Any, owner: type) -> Callable[..., Any]:
        if instance is None:
            return functools.partial(main_decorator, multiverse=owner)
        return cast(Callable[..., Any], instance._step)


def _module(model: Any) -> Any:
    return model.module() if isinstance(model, Craft) and hasattr(model, "module") else model


class Multiverse(_Multiverse):
    """``Multiverse(universe, nworld=1)``: ``mv()`` runs ``universe(mv)`` on `nworld` processes.

    Each process is a torch worker (gloo on the CPU, NCCL on GPUs); Tanks given to `sync`
    serve each process its share of every epoch (Nebulae's Tank sharded itself by the
    launcher's RANK). `options` are dualtrain's (``timeout``, DDP's keywords).
    """

    def __init__(self, universe: Callable[..., Any], nworld: int = 1, **options: Any) -> None:
        options.setdefault("backend", "torch")
        super().__init__(universe, nworld, **options)

    def _step(self, func: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(func):
            raise bad_argument("func", func, "the step function to decorate")

        @functools.wraps(func)
        def step(*args: Any, **kwargs: Any) -> Any:
            return func(*args, **kwargs)

        return step

    Executor = _Executor()

    def reduce(self, value: Any, aggregate: bool = False) -> Any:
        """`value` averaged (`aggregate`: summed) over the processes; gradients pass through.

        ``loss = mv.reduce(loss)`` before ``optz(loss)`` (Nebulae's demos) reports the
        global mean and back-propagates the local loss, so DDP's averaged gradients are
        the plain DDP step's. (Nebulae's reduce hid its all-reduce from autograd and so
        divided the gradients by the number of processes.)
        """
        if getattr(value, "requires_grad", False) is True:
            reduced = super().reduce(value.detach(), aggregate)
            return value + (reduced - value).detach()
        return super().reduce(value, aggregate)

    def sync(self, models: Any, data: Any) -> Any:  # type: ignore[override]
        """``(*synced models, *data)``: models wrapped for DDP, Tanks sharded in place."""
        many = isinstance(models, (tuple, list))
        given = [_module(m) for m in (models if many else [models])]
        synced = super().sync(given, data)
        tanks = list(data) if isinstance(data, (tuple, list)) else [data]
        return (*synced, *tanks)
