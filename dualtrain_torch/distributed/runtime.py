"""Multiverse under torch: torch.distributed's process group, DDP, and a data-parallel learner.

`join(world, timeout=, steps=)` joins the run `world` describes (gloo on the CPU, nccl on
CUDA, one process per device) and returns a `TorchRuntime`, the `dualtrain.multiverse.seams`
Runtime that `dualtrain.Multiverse` drives. Nothing here moves bytes itself: parameters are
broadcast and gradients mean-reduced by ``DistributedDataParallel``, metrics by
``dist.all_reduce``, objects by ``dist.all_gather`` of their pickled bytes.

A world of one process is a plain program: no process group, no DDP (a `SoloModule` wraps
the model with DDP's surface and nothing else), no collective. A hand-written loop on one
process has none of them, and each cost a step a few hundred microseconds.
"""

from __future__ import annotations

import contextlib
import datetime
import pickle
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.multiverse.seams import Steps, distributed_traits
from dualtrain.multiverse.world import World
from dualtrain.validate import check_seed
from dualtrain_torch.distributed.exchange import TorchExchange
from dualtrain_torch.distributed.exit import handed, release
from dualtrain_torch.distributed.learner import DistributedLearner, carries_rows
from dualtrain_torch.distributed.reduce import reduce_value

__all__ = ["SoloModule", "SyncedModule", "TorchRuntime", "join"]

_TARGETS = ("numpy", "torch", "jax")
_retired: list[Any] = []  # groups left: kept alive until exit (see TorchRuntime.leave)
_ours = [False]  # whether the default process group is one join() created (leave destroys it)


def join(world: World, /, timeout: float, steps: Steps) -> TorchRuntime:
    """Joins the run `world` describes: the default process group, then this process's Runtime.

    The backend is nccl when CUDA is available (this process then drives
    ``cuda:<local_rank>``), else gloo. A world of one process makes no group at all; a
    torchrun world joins through ``env://`` (torchrun's own store); any other through
    ``tcp://<master_addr>:<master_port>``, rank 0 listening. A default group that already
    exists (the script called ``init_process_group``) is reused when its rank and size match
    `world` (a group of one is left unused: a world of one runs no collective).

    Args:
        world: this process's place in the run.
        timeout: seconds the joining and every later collective may take.
        steps: its `on_step` is called once per training step (each learner step; each
            forward of a synced model in training mode outside a learner), its `on_begin`
            as a learner step starts (its count comes at its end).

    Raises:
        ArgumentError: a bad `world` or `timeout`; an existing group that does
            not match `world`; a local rank with no CUDA device.
    """
    if not isinstance(world, World):
        raise bad_argument("world", world, "a dualtrain.multiverse.World")
    if not world.processes >= 1 or not 0 <= world.rank < world.processes:
        raise bad_argument("world", world, "a rank in [0, processes) and processes >= 1")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise bad_argument("timeout", timeout, "a positive number of seconds")
    cuda = torch.cuda.is_available()
    if cuda and world.local_rank >= torch.cuda.device_count():
        raise bad_argument(
            "world.local_rank", world.local_rank,
            f"less than the {torch.cuda.device_count()} CUDA devices of this host",
        )  # fmt: skip
    device = torch.device("cuda", world.local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if dist.is_initialized():
        rank, size = dist.get_rank(), dist.get_world_size()
        if (rank, size) != (world.rank, world.processes):
            raise ArgumentError(
                f"the default process group is rank {rank} of {size}; world says rank "
                f"{world.rank} of {world.processes}"
            )
    elif world.processes > 1:
        _init_group(world, "nccl" if cuda else "gloo", device, float(timeout))
        _ours[0] = True
    return TorchRuntime(world, device, steps.on_step, steps.on_begin)


def _init_group(world: World, backend: str, device: torch.device, timeout: float) -> None:
    options: dict[str, Any] = {
        "backend": backend, "rank": world.rank, "world_size": world.processes,
        "timeout": datetime.timedelta(seconds=timeout),
    }  # fmt: skip
    if device.type == "cuda":
        options["device_id"] = device  # nccl binds its communicator to this device now
    if world.agent:
        # The elastic agent serves the store, and keeps it over restarts: each attempt's
        # keys under a prefix of its own, so a restarted worker never reads the address a
        # dead one left there (env:// would, and fail to connect).
        store = dist.TCPStore(
            world.master_addr, world.master_port, world.processes, is_master=False,
            timeout=datetime.timedelta(seconds=timeout),
        )  # fmt: skip
        options["store"] = dist.PrefixStore(f"dualtrain/attempt-{world.restart_count}", store)
    elif world.source == "torchrun":
        options["init_method"] = "env://"  # torchrun's rank 0 serves the store
    elif not world.master_addr or not world.master_port:
        raise bad_argument(
            "world", world, "a master_addr and master_port for several processes (MASTER_ADDR)"
        )
    else:
        options["init_method"] = f"tcp://{world.master_addr}:{world.master_port}"
    dist.init_process_group(**options)


def _wrapped_attribute(synced: nn.Module, name: str) -> Any:
    """A synced model's attribute, else the wrapped module's (``synced.fc`` is ``.module.fc``)."""
    try:
        return nn.Module.__getattr__(synced, name)
    except AttributeError:
        if name == "module":  # half-built (unpickling): no recursion
            raise
        return getattr(nn.Module.__getattr__(synced, "module"), name)


class SyncedModule(DistributedDataParallel):
    """A DDP that answers for the module it wraps: ``synced.fc`` is ``synced.module.fc``.

    Attributes DDP lacks are looked up on the wrapped module (Nebulae's wrapper did the
    same), so code written for the plain model keeps working on the synced one.
    """

    @property
    def dualtrain_wrapped(self) -> nn.Module:
        """The wrapped module: what `TimeMachine.drop` and `to` take in this one's place."""
        return self.module

    def register_comm_hook(self, state: object, hook: Callable[..., Any]) -> None:
        """DDP's ``register_comm_hook``; refused, naming the fix, once a learner has stepped.

        A learner's rows and loss ride in this DDP's first bucket through a comm hook of
        its own from its first step on, and DDP takes one hook per model.
        """
        if carries_rows(self):
            raise bad_argument(
                "hook", getattr(hook, "__qualname__", hook), "registered before the "
                "learner's first step (its rows ride in this DDP's buckets through a comm "
                "hook of its own, and DDP takes one; the learner then keeps yours and sums "
                "the rows apart)"
            )  # fmt: skip
        super().register_comm_hook(state, hook)

    def _register_builtin_comm_hook(self, comm_hook_type: Any) -> None:
        if carries_rows(self):
            raise bad_argument(
                "comm_hook_type", comm_hook_type, "registered before the learner's first "
                "step (its rows ride in this DDP's buckets through a comm hook of its own)"
            )  # fmt: skip
        super()._register_builtin_comm_hook(comm_hook_type)

    def __getattr__(self, name: str) -> Any:
        return _wrapped_attribute(self, name)


class SoloModule(nn.Module):
    """A world of one's synced model: the module itself, behind DDP's surface, with no DDP.

    One process has no replica to agree with, so there is nothing to broadcast and no
    gradient to reduce: the forward is the module's. What code written for several workers
    reads keeps working: ``synced.module``, ``no_sync()``, attributes answered by the
    wrapped module, and `state_dict` keys under ``module.`` as DDP's are (a checkpoint of a
    run of one loads into a run of two).
    """

    def __init__(
        self,
        module: nn.Module,
        on_forward: Callable[[nn.Module], None],
        device: torch.device | None = None,
    ) -> None:
        super().__init__()
        self.module = module
        self.require_backward_grad_sync = True  # DDP's flag: False inside no_sync()
        self._on_forward = on_forward  # counts a training forward as a step
        self._device = device  # CUDA: inputs move there, as DDP's with device_ids do

    @property
    def dualtrain_wrapped(self) -> nn.Module:
        """The wrapped module: what `TimeMachine.drop` and `to` take in this one's place."""
        return self.module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's forward (a training-mode call counts as a step).

        On CUDA, tensors among the inputs (in tuples, lists and dicts too) move to the
        module's device first, as DDP's forward moves them.
        """
        self._on_forward(self)
        if self._device is not None:
            args, kwargs = _moved(args, self._device), _moved(kwargs, self._device)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """DDP's ``no_sync``: with one process, gradients accumulate locally anyway."""
        before, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before

    def __getattr__(self, name: str) -> Any:
        return _wrapped_attribute(self, name)


def _moved(value: Any, device: torch.device) -> Any:
    """`value` with every tensor in it on `device` (tuples, named tuples, lists, dicts)."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return type(value)((k, _moved(v, device)) for k, v in value.items())
    if isinstance(value, list):
        return [_moved(v, device) for v in value]
    if isinstance(value, tuple):
        items = [_moved(v, device) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


_SYNCED = (DistributedDataParallel, SoloModule)


class TorchRuntime:
    """One process's handle on a joined torch run (`dualtrain.multiverse.seams.Runtime`).

    Attributes:
        nworld: processes in the run (one replica each).
        local_devices: replicas this process drives: 1.
        rank, local_rank: this process's place, as in its `World`.
        device: where its replica lives (``cuda:<local_rank>`` or the CPU).
        backend: the process group's backend, "gloo" or "nccl"; None in a world of one
            (no group, no collective).
    """

    def __init__(
        self,
        world: World,
        device: torch.device,
        on_step: Callable[[], None],
        on_begin: Callable[[], None] | None = None,
    ) -> None:
        self.world, self.device, self._on_step = world, device, on_step
        self._on_begin = on_begin
        self.local_rank, self.local_devices = world.local_rank, 1
        self.backend: str | None = None
        if world.processes == 1:
            self.nworld, self.rank = 1, 0
        else:
            self.nworld, self.rank = dist.get_world_size(), dist.get_rank()
            self.backend = str(dist.get_backend())
        self._quiet = 0  # > 0 inside a learner step: it counts its own step
        self._left = False

    def row_exchange(self) -> TorchExchange:
        """A gloo all-to-all of host rows for a sharded store (makes its own group)."""
        return TorchExchange()

    def scope(self) -> AbstractContextManager[Any]:
        """On CUDA, this process's device as the current one; on the CPU, nothing."""
        if self.device.type == "cuda":
            return torch.cuda.device(self.device)
        return contextlib.nullcontext()

    def sync_model(self, model: Any, /, options: dict[str, Any]) -> Any:
        """`model` (a realized Craft or any ``nn.Module``) wrapped in a `SyncedModule` (DDP).

        Rank 0's parameters and buffers are broadcast at wrapping; every backward then
        mean-reduces the gradients. On CUDA the model moves to ``cuda:<local_rank>`` first.
        A model that is already a DDP is returned as it is. In a world of one the wrapper
        is a `SoloModule`: no DDP (the options are checked, and have nothing to act on).

        Args:
            model: the module; its parameters are kept (an optimizer made before still fits).
            options: passed to DDP: ``bucket_cap_mb`` (float > 0, MiB per all-reduce
                bucket), ``find_unused_parameters``, ``broadcast_buffers``,
                ``gradient_as_bucket_view``, ``static_graph`` (bools).

        Raises:
            ArgumentError: not a module, no parameter that requires grad, an unknown option
                or a bad option value (each named).
        """
        if isinstance(model, _SYNCED):
            return model
        if not isinstance(model, nn.Module):
            raise bad_argument("model", model, "a torch.nn.Module (or a realized Craft)")
        if not any(p.requires_grad for p in model.parameters()):
            raise bad_argument("model", type(model).__name__, "a module with trainable parameters")
        ddp = _ddp_options(options)
        if self.device.type == "cuda":
            model.to(self.device)
            ddp.update(device_ids=[self.device.index], output_device=self.device.index)
        if self.nworld == 1:
            cuda = self.device if self.device.type == "cuda" else None
            return SoloModule(model, self._forward_hook, cuda)
        synced = SyncedModule(model, **ddp)
        synced.register_forward_pre_hook(self._forward_hook)
        return synced

    def _forward_hook(self, synced: Any, args: Any = ()) -> None:
        if synced.module.training and not self._quiet:
            self._on_step()

    def unwrap(self, model: Any, /) -> Any:
        """The module a synced model wraps (what `TimeMachine` takes), else `model`."""
        return model.module if isinstance(model, _SYNCED) else model

    def batch_device(self, to: str, /) -> Any:
        """Where a Tank serving `to` delivers: torch on CUDA ``cuda:<local_rank>``, else None."""
        if to not in _TARGETS:
            raise bad_argument("to", to, "one of " + ", ".join(map(repr, _TARGETS)))
        return self.device if to == "torch" and self.device.type == "cuda" else None

    def reduce(self, value: Any, /, aggregate: bool) -> Any:
        """`value` summed (`aggregate`) or averaged over the processes, in the kind it came in.

        Leaves are numbers, torch tensors (any device) and NumPy arrays or scalars; tuples,
        lists and dicts of them keep their structure. One all-reduce per wire dtype (float64,
        float32, int64), on a copy: `value` is never changed. Dtypes follow NumPy: floats
        keep theirs; integers and bools sum as int64 and average as float64. Every process
        must pass the same structure, dict keys (in the same order), dtypes and shapes;
        one more small all-reduce checks it first.

        Raises:
            ArgumentError: a leaf it cannot reduce; layouts that differ across processes
                (raised on every process, naming each one's layout).
        """
        return reduce_value(self, value, aggregate)

    @property
    def comm_device(self) -> torch.device:
        """Where collectives' tensors live: this process's device under nccl, else the CPU."""
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def gather_object(self, obj: Any, /) -> list[Any]:
        """Every process's `obj` (picklable), in rank order.

        ``dist.all_gather_object``'s protocol (pickled bytes, their lengths gathered first),
        on tensors registered with `distributed.exit.handed` so that leaving waits for them.
        """
        if self.nworld == 1:
            return [pickle.loads(pickle.dumps(obj))]  # a copy, as from another process
        device = self.comm_device
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
        sizes = [torch.zeros_like(size) for _ in range(self.nworld)]
        handed(size, *sizes)
        dist.all_gather(sizes, size)
        longest = max(int(s) for s in sizes)
        mine = torch.zeros(longest, dtype=torch.uint8, device=device)
        mine[: data.numel()] = data.to(device)
        everyone = [torch.empty_like(mine) for _ in range(self.nworld)]
        handed(mine, *everyone)
        dist.all_gather(everyone, mine)
        return [
            pickle.loads(part[: int(n)].cpu().numpy().tobytes())
            for part, n in zip(everyone, sizes, strict=True)
        ]

    def barrier(self) -> None:
        """Waits until every process reaches it (``dist.barrier``; nothing in a world of one)."""
        if self.nworld == 1:
            return
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def seed(self, seed: int, /) -> int:
        """Seeds torch's generators (CPU and every CUDA device) with `seed`; returns it."""
        seed = check_seed("seed", seed)
        torch.manual_seed(seed)
        return seed

    def no_sync(self, model: Any, /) -> AbstractContextManager[Any]:
        """DDP's ``no_sync``: backward passes inside accumulate local gradients.

        The first backward after it reduces everything accumulated.
        """
        if not isinstance(model, _SYNCED):
            raise bad_argument("model", type(model).__name__, "a model returned by sync()")
        return model.no_sync()

    def learner(
        self,
        model: Any,
        /,
        optimizer: Any,
        loss_fn: Callable[..., Any] | None,
        engine: str,
    ) -> DistributedLearner:
        """A `DistributedLearner` over `model` (synced here, with DDP's defaults, if it is not).

        Raises:
            ArgumentError: `engine` other than "jit" (torch's data parallelism is DDP), an
                optimizer that is not a ``torch.optim.Optimizer`` over the model's
                parameters, a `loss_fn` that is not callable.
        """
        if engine != "jit":
            raise bad_argument("engine", engine, "'jit' under torch (DDP; 'pmap' is JAX's)")
        if loss_fn is not None and not callable(loss_fn):
            raise bad_argument("loss_fn", loss_fn, "a function (outputs, targets) -> loss")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise bad_argument("optimizer", optimizer, "a torch.optim.Optimizer")
        synced = self.sync_model(model, {})
        owned = {id(p) for p in synced.parameters()}
        if any(id(p) not in owned for g in optimizer.param_groups for p in g["params"]):
            raise bad_argument(
                "optimizer", type(optimizer).__name__, "an optimizer over the model's parameters"
            )
        return DistributedLearner(self, synced, optimizer, loss_fn)

    def leave(self) -> None:
        """Destroys the process group join() created (idempotent).

        A group the script created itself (``init_process_group`` before joining) is left.
        """
        if self._left:
            return
        self._left = True
        if _ours[0] and dist.is_initialized():
            # A DDP that outlives the group holds it; were the DDP the last holder, its
            # deallocation (GIL held) would join the group's threads while one of them waits
            # for the GIL to drop its last work: a deadlock (seen under gloo). Kept here,
            # the group ends with the process, its threads long idle.
            _retired.append(dist.group.WORLD)
            dist.destroy_process_group()
            # Before the interpreter can finalize: gloo's threads drop what the last
            # collectives held (see distributed.exit; an abort otherwise, now and then).
            release()
        _ours[0] = False

    @contextlib.contextmanager
    def counted_step(self) -> Iterator[None]:
        """One training step: synced forwards inside are not counted, the step is, once.

        `on_begin` (when given) is told as it starts: the step is counted at its end.
        """
        if self._on_begin is not None and not self._quiet:
            self._on_begin()
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1
        self._on_step()


def _ddp_options(options: Any) -> dict[str, Any]:
    if not isinstance(options, dict):
        raise bad_argument("options", options, "a dict of DDP options")
    # This adapter's TRAITS, through the registry (the package that declares them imports
    # this module): each option is passed to DDP as it is.
    known = distributed_traits("torch").sync_options
    for name, value in options.items():
        if name not in known:
            raise bad_argument("option", name, "one of " + ", ".join(map(repr, known)))
        if name == "bucket_cap_mb":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise bad_argument(name, value, "a positive number of MiB")
        elif not isinstance(value, bool):
            raise bad_argument(name, value, "a bool")
    return dict(options)
