"""What Multiverse asks of an adapter's ``distributed`` part: traits and agent, a join, a Runtime.

`distributed_part(name)` returns the adapter's module typed as `DistributedPart`, and
`distributed_traits(name)` its `DistributedTraits` without importing the framework;
``tests/test_seams.py`` checks both adapters against these signatures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from dualtrain import backends
from dualtrain.embeddings.sharding import Exchange
from dualtrain.errors import bad_argument
from dualtrain.multiverse.world import World

__all__ = [
    "Agent",
    "DistributedPart",
    "DistributedTraits",
    "Launch",
    "Runtime",
    "Steps",
    "distributed_part",
    "distributed_traits",
]


@dataclass(frozen=True)
class Launch:
    """A run's workers on this host, as Multiverse asks an adapter's `Agent` to start them.

    The agent runs ``target(*args)`` in each of `processes` workers, started with the ``spawn``
    method, with the launching process's environment and `environment` added to it,
    torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``) and their attempt (`World.restart_count`); it watches
    them, stops every worker at the first failure and, `max_restarts` times at most, starts
    them all again. A worker that is `finished` has done its work: its end, whatever its exit
    code (Multiverse may have stopped it, hung on its way out), is no failure.

    Attributes:
        target: the worker body (spawned: it must be importable by name).
        args: its arguments (pickled to each worker).
        processes: workers, one a rank.
        max_restarts: times every worker is started again after one failed.
        timeout: seconds the workers may take to meet, where the agent has a rendezvous.
        log_dir: a folder the agent may keep its own files in.
        environment: the run's variables, set in each worker's environment before it starts
            (set in ``os.environ`` while a worker starts, under `launch.environment`'s lock,
            and only then: the launching process's own environment is the user's).
        finished: ``finished(attempt, rank)``: whether that worker reported its result.
    """

    target: Callable[..., Any]
    args: tuple[Any, ...]
    processes: int
    max_restarts: int
    timeout: float
    log_dir: str
    environment: Mapping[str, str]
    finished: Callable[[int, int], bool]


# An adapter's way to launch a run's workers (`DistributedTraits.agent`): it returns {} when
# every worker returned, else the last attempt's failed ranks and exit codes (negative: killed
# by that signal); Ctrl-C raises KeyboardInterrupt once every worker is stopped.
Agent = Callable[[Launch], dict[int, int]]


@dataclass(frozen=True)
class DistributedTraits:
    """A framework's policy for a run, declared by its adapter: Multiverse reads, never branches.

    Attributes:
        name: the framework as messages name it.
        engines: the engines `Runtime.learner` takes.
        engines_hint: how a refused engine is told what to pass instead.
        one_process_per_device: every replica is a process of its own, so ``nworld`` counts
            processes; else a process drives several devices (``nworld // processes``, one
            process by default) and ``nworld`` counts the devices of all processes.
        host_devices: on the CPU, the devices a process drives are host devices an XLA flag
            asks for before the framework is imported.
        coordinator: the processes meet at a coordinator of the framework's own; else at
            rank 0's store (``MASTER_ADDR``, which a run over several hosts must export).
        sync_options: the keywords `Runtime.sync_model` takes (Multiverse's own ``**``).
        wraps_models: `Runtime.sync_model` wraps a model, and a learner steps the wrapped
            one: Multiverse wraps a learner's model with its sync options first.
        joins_early: the process joins before the universe runs (a runtime that can join
            only before it computes anything), else at `init` or its first need.
        agent: how the framework launches and supervises a run's workers (`Agent`): `mv()`
            launches through it. Keyword-only (and required), so that the positional
            fields keep the places they had before it.
    """

    name: str
    engines: tuple[str, ...]
    engines_hint: str
    one_process_per_device: bool = False
    host_devices: bool = False
    coordinator: bool = False
    sync_options: tuple[str, ...] = ()
    wraps_models: bool = False
    joins_early: bool = False
    agent: Agent = field(kw_only=True)


@dataclass(frozen=True)
class Steps:
    """How a joined runtime tells Multiverse of training steps (what `DistributedPart.join` takes).

    Multiverse counts them to name the step in errors, and its heartbeat reads them to name a
    worker that stopped.

    Attributes:
        on_step: called once per training step (each learner step, and each forward in
            training mode of a model the runtime wraps).
        on_begin: where given, called as a step that is counted at its end starts (a learner
            step whose collectives come before its count), so the heartbeat tells a worker
            waiting in a step's collective from one that never began it.

    Raises:
        ArgumentError: an `on_step` that is not callable, an `on_begin` neither None nor
            callable.
    """

    on_step: Callable[[], None]
    on_begin: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        if not callable(self.on_step):
            raise bad_argument("on_step", self.on_step, "a function taking no argument")
        if self.on_begin is not None and not callable(self.on_begin):
            raise bad_argument("on_begin", self.on_begin, "None or a function taking no argument")


class Runtime(Protocol):
    """One process's handle on a joined run (what `DistributedPart.join` returns).

    Attributes:
        nworld: data-parallel replicas in the run (over all processes).
        local_devices: the replicas this process drives.
    """

    nworld: int
    local_devices: int

    def scope(self) -> AbstractContextManager[Any]:
        """A context in which the run's devices are the default."""
        ...

    def sync_model(self, model: Any, /, options: dict[str, Any]) -> Any:
        """`model` with rank 0's parameters on every rank, its gradients mean-reduced.

        `options` are the traits' `sync_options` the caller gave.
        """
        ...

    def unwrap(self, model: Any, /) -> Any:
        """The model as it is without the run's wrapping (what checkpoints take)."""
        ...

    def batch_device(self, to: str, /) -> Any:
        """Where a Tank serving `to` ("numpy", "torch", "jax") delivers (None: the host)."""
        ...

    def reduce(self, value: Any, /, aggregate: bool) -> Any:
        """`value` (a scalar, an array, or a tuple, list or dict of them) over processes.

        Summed when `aggregate`, else averaged; returned in the kind it came in.
        """
        ...

    def gather_object(self, obj: Any, /) -> list[Any]:
        """Every process's `obj` (picklable), in rank order, on every process."""
        ...

    def barrier(self) -> None:
        """Waits until every process reaches it."""
        ...

    def seed(self, seed: int, /) -> Any:
        """Seeds the framework's global RNG with `seed` (already per rank); its seed object."""
        ...

    def no_sync(self, model: Any, /) -> AbstractContextManager[Any]:
        """A context in which backward passes accumulate gradients without reducing them."""
        ...

    def learner(
        self,
        model: Any,
        /,
        optimizer: Any,
        loss_fn: Callable[..., Any] | None,
        engine: str,
    ) -> Any:
        """A data-parallel learner: ``.step(inputs, targets, mask=None) -> loss``.

        The loss is the mean over the global batch (every replica's rows; with `mask`, the
        rows it marks True), and one step equals a single-replica step on that batch.
        `engine` is one of the traits' `engines`.
        """
        ...

    def row_exchange(self) -> Exchange:
        """An all-to-all over the processes for a sharded EmbeddingStore.

        Making it is a collective (every process makes one, in the same order).
        """
        ...

    def leave(self) -> None:
        """Leaves the run (what of it the framework can end in a living process)."""
        ...


class DistributedPart(Protocol):
    """``dualtrain_<name>.distributed``, used by `dualtrain.Multiverse`.

    Attributes:
        TRAITS: the framework's policy; importing the module imports no framework.
    """

    TRAITS: DistributedTraits

    def join(self, world: World, /, timeout: float, steps: Steps) -> Runtime:
        """Joins the run `world` describes and returns this process's Runtime.

        `timeout` (seconds) bounds the joining (and, where the framework can, every
        collective). The runtime tells `steps` of each training step.
        """
        ...


def distributed_part(name: str) -> DistributedPart:
    """Backend `name`'s ``distributed`` module (loads its framework)."""
    return backends.load_part(name, "distributed")


def distributed_traits(name: str) -> DistributedTraits:
    """Backend `name`'s `DistributedTraits`, read without importing its framework."""
    traits: DistributedTraits = backends.traits(name, "distributed")
    return traits
