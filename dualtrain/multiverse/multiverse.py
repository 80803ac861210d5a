"""Multiverse: one training function run data-parallel on torch.distributed or JAX's runtime."""

from __future__ import annotations

import functools
import math
import os
import random
import signal
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain import backends
from dualtrain.deprecation import moved
from dualtrain.embeddings.store import EmbeddingStore
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.multiverse.checks import check_divisible, is_number, is_tank, positive_count
from dualtrain.multiverse.devices import host_devices
from dualtrain.multiverse.heartbeat import RUN, Beats, Watchdog, check_heartbeat
from dualtrain.multiverse.launch import (
    GRACE,
    ExitWatch,
    FileReport,
    ReportWatch,
    check_class,
    check_picklable,
    end_group,
    exit_soon,
    failure_error,
    own_group,
    read_report,
    report_failure,
    report_result,
    stop_groups,
    watch_parent,
)
from dualtrain.multiverse.rank_zero import RankZeroTimeMachine
from dualtrain.multiverse.seams import (
    Launch,
    Runtime,
    Steps,
    distributed_part,
    distributed_traits,
)
from dualtrain.multiverse.world import World, from_environment, run_environment
from dualtrain.validate import check_seed

__all__ = ["Multiverse", "main_decorator"]


class Multiverse:
    """Runs ``universe(mv, *args)`` on `nworld` data-parallel workers (Nebulae's Multiverse).

    torch: `nworld` processes, one device each (gloo on the CPU, nccl on CUDA), launched by
    `mv()` through torch's elastic agent; under torchrun or SLURM the process joins the
    launcher's run instead and `nworld` is the launcher's. JAX: `processes` processes
    (default 1) driving `nworld` devices in all: one process runs `universe` itself over its
    first `nworld` devices (on the CPU, host devices are made when JAX is not imported yet);
    several are spawned by the adapter's agent and joined by ``jax.distributed.initialize``.
    A worker that raises or dies stops the others; `mv()` then raises `WorkerError` naming its
    rank and step (or, with `max_restarts`, starts them all again).

    Args:
        universe: ``universe(mv, *args)``, the training function. Spawned workers import it
            by name: a function at the top level of a module (a script's ``__main__`` too).
        nworld: data-parallel replicas (torch: processes; JAX: devices over all processes).
        backend: "torch" or "jax".
        timeout: seconds for joining the run and (torch) for each collective to finish.
        engine: JAX: "jit" (sharded jit) or "pmap" for `learner` steps; torch: "jit" (DDP).
        processes: JAX only: processes to spawn (a divisor of `nworld`); torch: `nworld`.
        max_restarts: times a run that `mv()` launches is started again, every worker, after
            one failed (by the adapter's agent: torch's elastic agent, JAX's spawner);
            `restart_count` tells the universe, which resumes from its last anchor. Under
            torchrun, its ``--max-restarts`` decides instead.
        heartbeat: seconds a worker of a run `mv()` launches may go without a step, from
            its first step on, before it is named stalled, by its own rank, and stopped
            (as a failure: restarted where `max_restarts` allows); None (the default): not
            watched.
        **sync_options: torch: DistributedDataParallel's ``bucket_cap_mb``,
            ``find_unused_parameters``, ``broadcast_buffers``, ``gradient_as_bucket_view``,
            ``static_graph`` for `sync`.

    Attributes:
        nworld, rank, local_rank, processes, is_main, step (training steps this worker has
        taken: learner steps and, torch, forwards of synced models in training mode),
        restart_count (how many times the run was started again after a failure).
    """

    def __init__(
        self,
        universe: Callable[..., Any],
        nworld: int = 1,
        *,
        backend: str = "torch",
        timeout: float = 300.0,
        engine: str = "jit",
        processes: int | None = None,
        max_restarts: int = 0,
        heartbeat: float | None = None,
        **sync_options: Any,
    ) -> None:
        if not callable(universe):
            raise bad_argument("universe", universe, "a function universe(mv, *args)")
        if backend not in tuple(backends.PARTS["distributed"]):
            raise bad_argument("backend", backend, "'torch' or 'jax'")
        traits = self._traits = distributed_traits(backend)
        per_device = traits.one_process_per_device
        nworld = positive_count("nworld", nworld)
        if not is_number(timeout) or not math.isfinite(timeout) or timeout <= 0:
            raise bad_argument("timeout", timeout, "a positive number of seconds")
        if engine not in traits.engines:
            raise bad_argument("engine", engine, traits.engines_hint)
        if processes is not None:
            processes = positive_count("processes", processes)
            if per_device and processes != nworld:
                raise bad_argument(
                    "processes", processes, f"None or nworld={nworld} under {backend} (one "
                    "process a device)"
                )  # fmt: skip
            if nworld % processes:
                raise bad_argument("processes", processes, f"a divisor of nworld={nworld}")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise bad_argument("max_restarts", max_restarts, "an int >= 0")
        self.max_restarts, self.heartbeat = max_restarts, check_heartbeat(heartbeat)
        unknown = sorted(set(sync_options) - set(traits.sync_options))
        if unknown:
            raise bad_argument(
                unknown[0], sync_options[unknown[0]], f"a keyword {backend} takes: one of "
                f"{traits.sync_options or f'none ({traits.name} sync has no options)'}"
            )  # fmt: skip
        self.universe, self.backend, self.timeout, self.engine = universe, backend, timeout, engine
        self._sync_options = dict(sync_options)
        self._requested = nworld
        self._processes = (nworld if per_device else 1) if processes is None else processes
        self._world: World | None = from_environment()
        if self._world is not None and self._world.source != "spawned":
            launched = self._world.processes
            if per_device and nworld not in (1, launched):
                warnings.warn(
                    f"Multiverse(nworld={nworld}) runs under {self._world.source}'s "
                    f"{launched} processes; nworld is {launched}", UserWarning, stacklevel=2,
                )  # fmt: skip
            if self.heartbeat is not None:  # said, not silently dropped
                warnings.warn(
                    f"Multiverse(heartbeat={self.heartbeat}) is not watched under "
                    f"{self._world.source}: the heartbeat watches the runs mv() launches, and "
                    f"here {self._world.source} supervises the workers; a stalled worker shows "
                    "as its peers' collective timeout (timeout=)", UserWarning, stacklevel=2,
                )  # fmt: skip
        self._runtime: Runtime | None = None
        self._beats: Beats | None = None  # a launched worker's row of the run's beats
        self.step = 0

    # ---- where this worker stands ---------------------------------------------------

    @property
    def world(self) -> World:
        """This process's World (the launcher's, or this process alone)."""
        if self._world is None:  # not stored: reading it must not make `mv()` run here
            devices = 0 if self._traits.one_process_per_device else self._requested
            return World(local_devices=devices)
        return self._world

    @property
    def nworld(self) -> int:
        """Data-parallel replicas: the run's processes, or the devices of all its processes."""
        if self._runtime is not None:
            return self._runtime.nworld
        world = self._world
        if world is None:
            return self._requested
        per = 1 if self._traits.one_process_per_device else world.local_devices
        return world.processes * per if per else self._requested

    @property
    def rank(self) -> int:
        """This process's rank (JAX: its process index)."""
        return self.world.rank

    @property
    def local_rank(self) -> int:
        """This process's index on its host."""
        return self.world.local_rank

    @property
    def processes(self) -> int:
        """Processes in the run."""
        return self.world.processes if self._world is not None else self._processes

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0: the one that logs and writes checkpoints."""
        return self.rank == 0

    @property
    def restart_count(self) -> int:
        """How many times this run was started again after a failure (0: the first attempt).

        torch's ``TORCHELASTIC_RESTART_COUNT`` (torchrun's, or the agent `mv()` launches
        through), or JAX's spawner's: a universe that finds it above 0 resumes from its last
        anchor.
        """
        return self.world.restart_count

    @property
    def runtime(self) -> Runtime:
        """The adapter's handle on the joined run (joins it first: `init`)."""
        self.init()
        assert self._runtime is not None
        return self._runtime

    # ---- running --------------------------------------------------------------------

    def __call__(self, *args: Any) -> Any:
        """Runs ``universe(mv, *args)`` on every worker and returns rank 0's result.

        Raises:
            WorkerError: a worker raised or died; the others were stopped.
            ArgumentError: a universe or arguments that cannot reach spawned workers.
        """
        if self._world is not None or self._processes == 1:
            if self._world is None and self._traits.host_devices and self._requested > 1:
                host_devices(self._requested)
            try:
                self._join_early()
                return self.universe(self, *args)
            finally:
                self.leave()
        check_picklable(self.universe, args)
        check_class(type(self))
        with tempfile.TemporaryDirectory(prefix="dualtrain-run-") as folder:
            run = Path(folder)
            (run / "pids").mkdir()
            beats = Beats.create(run, self._processes)
            watchdog = Watchdog(beats, self.heartbeat)
            try:
                with watchdog:
                    return self._launch(args, run, beats, watchdog)
            finally:
                stop_groups([int(p.name) for p in (run / "pids").iterdir()])

    def _config(self) -> dict[str, Any]:
        """The keywords each worker's Multiverse is made with."""
        return {
            "nworld": self._requested, "backend": self.backend, "timeout": self.timeout,
            "engine": self.engine, "max_restarts": self.max_restarts,
            "heartbeat": self.heartbeat, **self._sync_options,
        }  # fmt: skip

    def _launch(self, args: tuple[Any, ...], run: Path, beats: Beats, watchdog: Watchdog) -> Any:
        """Launches the workers through the adapter's agent; rank 0's result, or WorkerError.

        The run succeeds when every worker of its last attempt reported its result: one that
        exited with status 0 without a word failed; one stopped after its result came
        (`ReportWatch`) did not.
        """
        n, traits = self._processes, self._traits
        local = 0 if traits.one_process_per_device else self._requested // n
        env = {**run_environment(n, local, traits.host_devices), RUN: str(run)}
        reported = ReportWatch(run, beats)
        # The class's own, so a subclass (the Nebulae compat's) is what each worker runs.
        job = Launch(type(self)._work, (self.universe, self._config(), args), n,
                     self.max_restarts, self.timeout, str(run / "agent"), env,
                     reported.finished)  # fmt: skip
        with ExitWatch(beats) as exits, reported:
            failed = traits.agent(job)
        attempt = _attempt(beats)
        failed = {r: code for r, code in failed.items() if not reported.finished(attempt, r)}
        if not failed:
            missing = [r for r in range(n) if not reported.finished(attempt, r)]
            if not missing:
                report = read_report(run, attempt, 0)
                assert report is not None
                return report[2]
            # a result that could not be sent (an error report), or none came
            raise failure_error(run, attempt, n, dict.fromkeys(missing, 0), beats.__getitem__,
                                ended=exits.of(attempt))  # fmt: skip
        verdict = watchdog.verdict
        first = None
        if verdict is not None and verdict.attempt == attempt:
            first = (verdict.rank, verdict.steps, watchdog.what())
        raise failure_error(run, attempt, n, failed, beats.__getitem__, first, exits.of(attempt))

    @classmethod
    def _work(
        cls, universe: Callable[..., Any], config: dict[str, Any], args: tuple[Any, ...]
    ) -> None:
        """A launched worker's body: join, run the universe, report; never outlive the parent.

        Its place is in the environment its agent set; it reports in the run's folder. Its
        agent learns of success by the function's return, so a teardown that hangs after the
        report ends the process with status 0 instead (`exit_soon`).
        """
        world, run = from_environment(), Path(os.environ[RUN])
        assert world is not None
        rank = world.rank
        report = FileReport(run, world.restart_count, rank)
        own_group()  # what it starts (Tank workers, pools) is stopped with it
        watch_parent(os.getppid())
        mv: Multiverse | None = None
        try:
            (run / "pids" / str(os.getpid())).touch()
            mv = cls(universe, **config)
            mv._beats = Beats.open(run)
            mv._beats.start(rank, mv.restart_count)
            mv._join_early()
            result = universe(mv, *args)
            mv._beats.done(rank)
        except BaseException as err:  # everything reaches the parent, Ctrl-C too
            if mv is not None and mv._beats is not None:
                mv._beats.done(rank)
            report_failure(report, mv.step if mv is not None else 0, err)
            sys.stderr.flush()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            end_group(signal.SIGTERM)  # its children; the parent SIGKILLs what stays
            os._exit(1)  # no atexit: a process group left mid-collective can hang its teardown
        # Reported before leaving: a teardown that hangs or fails cannot undo it.
        report_result(report, mv.step, result if rank == 0 else None)
        exit_soon(GRACE)
        mv.leave()

    def init(self) -> Multiverse:
        """Joins the run (idempotent; `sync`, `reduce` and the rest call it when needed)."""
        if self._runtime is None:
            if self._world is None and self._processes > 1:
                raise ArgumentError(
                    f"this process is not a worker of a run of {self._processes} processes: "
                    "call mv() to start them (init() joins from inside the universe)"
                )
            if not self._traits.coordinator and not self.world.master_addr:
                raise ArgumentError(
                    f"{self.world.source} runs {self.world.processes} processes over several "
                    f"hosts: export MASTER_ADDR (rank 0's host) and MASTER_PORT for "
                    f"{self._traits.name}"
                )
            part = distributed_part(self.backend)
            steps = Steps(self._on_step, self._on_begin)
            self._runtime = part.join(self.world, timeout=self.timeout, steps=steps)
        return self

    def _join_early(self) -> None:
        """Joins before the universe runs where the traits say so (else at `init` or need).

        Some runtimes (JAX's) can join a run of several processes only before they compute
        anything, and realizing a model computes.
        """
        if self._traits.joins_early:
            self.init()

    def leave(self) -> None:
        """Leaves the run (`mv()` does it when `universe` returns)."""
        if self._runtime is not None:
            runtime, self._runtime = self._runtime, None
            runtime.leave()

    def _on_begin(self) -> None:
        if self._beats is not None:
            self._beats.begin(self.rank, self.step + 1)

    def _on_step(self) -> None:
        self.step += 1
        if self._beats is not None:
            self._beats.step(self.rank, self.step)

    # ---- the six calls of Nebulae's brochure ------------------------------------------

    @contextmanager
    def scope(self) -> Iterator[Multiverse]:
        """A context in which the run's devices are the default (JAX: its mesh)."""
        with self.runtime.scope():
            yield self

    def sync(self, models: Any, data: Any = ()) -> Any:
        """Rank 0's parameters on every worker, gradients mean-reduced; Tanks sharded per rank.

        Args:
            models: a model or a tuple or list of models: torch, realized Crafts or any
                ``nn.Module`` (returned wrapped in DistributedDataParallel); JAX, realized
                modules or pytrees of arrays (returned replicated over the mesh). An
                `EmbeddingStore` among them becomes this process's shard, in place and
                returned as it is: its ids split in `processes` contiguous ranges, this
                process holding only its own (``store.rows``); attach it as before
                (docs/embeddings.md, "Sharded across processes").
            data: a Tank or a tuple or list of Tanks, changed in place: each serves this
                process's share of every epoch (``Tank.shard``) to the run's devices. Every
                process must serve as many batches per epoch, else ArgumentError (a process
                with a batch more would wait forever in its last step).

        Returns:
            The synced models, in the structure given.
        """
        tanks = list(data) if isinstance(data, (tuple, list)) else [data]
        for i, tank in enumerate(tanks):
            if not is_tank(tank):
                raise bad_argument(f"data[{i}]", tank, "a dualtrain.Tank")
            if tank.position != 0:
                raise ArgumentError(
                    f"data[{i}]: sync a Tank at the start of an epoch; it has served "
                    f"{tank.position} of its {tank.batches_per_epoch} batches"
                )
        runtime = self.runtime
        # Everything checked before anything changes: the shares, then that every process
        # serves as many batches, then the models; the Tanks change last.
        shares = [tank.plan_shard(self.rank, self.processes, runtime.batch_device(tank.to))
                  for tank in tanks]  # fmt: skip
        for i, (order, _, device) in enumerate(shares):
            check_divisible(i, order, runtime.local_devices if device is not None else 1)
        many = isinstance(models, (tuple, list))
        given = list(models) if many else [models]
        stores = {i: m.signature() for i, m in enumerate(given) if isinstance(m, EmbeddingStore)}
        # One collective for every check: the Tanks' batch counts and the stores' makings.
        every = runtime.gather_object(([order.batches for order, _, _ in shares], stores))
        for i in range(len(tanks)):
            counts = [ranks[i] for ranks, _ in every]
            if len(set(counts)) > 1:
                raise ArgumentError(
                    f"data[{i}]: the processes serve different numbers of batches per epoch "
                    f"{counts} (by rank); every process must take as many steps: shard the "
                    "same pack, with drop_last=True or pad=True"
                )
        made = [theirs for _, theirs in every]
        if any(theirs != stores for theirs in made):
            raise ArgumentError(
                "models: every process must sync the same EmbeddingStores, made alike (a "
                "shard's rows are drawn from its own arguments, not broadcast); by rank: "
                f"{made}"
            )
        for i, model in enumerate(given):
            if isinstance(model, EmbeddingStore) and model.session is not None:
                raise ArgumentError(
                    f"models[{i}]: sync an EmbeddingStore before attaching it to an optimizer"
                )
            if isinstance(model, EmbeddingStore) and model.shard is not None:
                raise ArgumentError(f"models[{i}]: this EmbeddingStore is already a shard")
        synced_all = [
            self._shard_store(m) if isinstance(m, EmbeddingStore)
            else runtime.sync_model(m, dict(self._sync_options))
            for m in given
        ]  # fmt: skip
        synced = type(models)(synced_all) if many else synced_all[0]
        for tank, share in zip(tanks, shares, strict=True):
            tank.apply_shard(share)
        return synced

    def _shard_store(self, store: EmbeddingStore) -> EmbeddingStore:
        """`store` made this process's shard (nothing to do in a run of one process)."""
        if self.processes > 1:
            store.make_shard(self.rank, self.processes, self.runtime.row_exchange())
        return store

    def reduce(self, value: Any, aggregate: bool = False) -> Any:
        """`value` averaged (`aggregate`: summed) over the processes, in the kind it came in.

        A scalar, an array or a tuple, list or dict of them. Under JAX a learner's loss is
        already the mean over the global batch; `reduce` is for values each process holds.
        """
        if not isinstance(aggregate, (bool, np.bool_)):
            raise bad_argument("aggregate", aggregate, "a bool (True sums, False averages)")
        return self.runtime.reduce(value, aggregate=bool(aggregate))

    # ---- what a real run needs ----------------------------------------------------------

    def learner(
        self, model: Any, optimizer: Any, loss_fn: Callable[..., Any] | None = None,
        engine: str | None = None,
    ) -> Any:  # fmt: skip
        """A data-parallel learner: ``learner.step(inputs, targets, mask=None) -> loss``.

        One step on `nworld` replicas equals one single-worker step on the batch of all
        replicas' rows (with `mask`, the rows it marks True). `loss_fn(outputs, targets)`
        returns per-sample losses or their mean; default cross entropy on class indices.
        """
        engine = self.engine if engine is None else engine
        if engine not in self._traits.engines:
            raise bad_argument("engine", engine, "'jit' or 'pmap' (JAX); 'jit' (torch)")
        if loss_fn is not None and not callable(loss_fn):
            raise bad_argument("loss_fn", loss_fn, "None or loss_fn(outputs, targets)")
        if self._traits.wraps_models:  # a model not wrapped yet gets this Multiverse's options
            model = self.runtime.sync_model(model, dict(self._sync_options))
        return self.runtime.learner(model, optimizer, loss_fn, engine)

    def seed(self, seed: int) -> Any:
        """Seeds Python's, NumPy's and the framework's RNGs per rank; the framework's seed.

        The rank's seed is drawn from ``SeedSequence([seed, rank])``: different on every
        rank, the same on every run. Returns it as torch takes it (an int) or as a JAX key.
        """
        seed = check_seed("seed", seed)
        mine = int(np.random.SeedSequence([seed, self.rank]).generate_state(1)[0])
        random.seed(mine)
        np.random.seed(mine)  # noqa: NPY002 - the global RNG users' code draws from
        return self.runtime.seed(mine)

    def no_sync(self, model: Any) -> Any:
        """Backward passes accumulate gradients without reducing them (torch: DDP's no_sync)."""
        return self.runtime.no_sync(model)

    def barrier(self) -> None:
        """Waits until every process reaches it."""
        self.runtime.barrier()

    def print(self, *values: Any, **options: Any) -> None:
        """``print`` on rank 0 only (flushed): one line per step, not one per worker."""
        if self.is_main:
            print(*values, **{"flush": True, **options})

    def time_machine(self, machine: Any) -> RankZeroTimeMachine:
        """`machine` (a TimeMachine) for a run: rank 0 writes, every rank reads.

        Anchors are written once, by rank 0, and every rank waits until the file is there;
        reading waits until every rank has arrived, so no rank loads an anchor being
        replaced or deleted by retention. Synced models are unwrapped for it. A sharded
        EmbeddingStore's rows are the exception: every rank writes its part and rank 0 the
        manifest (``drop_embeddings``; docs/embeddings.md).
        """
        return RankZeroTimeMachine(machine, self)

    # ---- Nebulae's decorator -------------------------------------------------------------

    @staticmethod
    def Executor(  # noqa: N802 - Nebulae's name
        function: Callable[..., Any] | None = None, **options: Any
    ) -> Any:
        """Deprecated: `main_decorator`; Nebulae's ``Executor`` is in the compat namespace.

        ``@Multiverse.Executor`` marked the main function (see `main_decorator`); Nebulae's
        own code used ``@mv.Executor`` on step functions, which
        ``dualtrain.compat.nebulae.law.Multiverse`` keeps, with this form too.
        """
        moved(
            "Multiverse.Executor",
            "dualtrain.multiverse.main_decorator (or Multiverse(launch, n)(...) directly), or "
            "dualtrain.compat.nebulae.law.Multiverse.Executor (Nebulae's)",
        )
        return main_decorator(function, **options)


def _attempt(beats: Beats) -> int:
    """The latest attempt a worker of the run started."""
    return max((b.attempt for b in beats.read() if b.pid), default=0)


def main_decorator(
    function: Callable[..., Any] | None = None,
    *,
    multiverse: type[Multiverse] = Multiverse,
    **options: Any,
) -> Any:
    """Marks the main function: called without a Multiverse, it runs on one worker.

    ``@main_decorator`` (torch) or ``@main_decorator(backend="jax")``: then ``launch(cfg)``
    (or ``launch(None, cfg)``, the brochure's ``mv=None``) runs ``launch(mv, cfg)`` with
    ``mv = Multiverse(launch, 1, **options)``, and ``Multiverse(launch, 4)(cfg)`` runs it
    on four.

    Args:
        function: the main function ``launch(mv, ...)``.
        multiverse: the Multiverse class to run it with (a subclass, for compat).
        options: Multiverse's keywords (``backend``, ``timeout``...).
    """
    if function is None:
        return functools.partial(main_decorator, multiverse=multiverse, **options)
    if not callable(function):
        raise bad_argument("function", function, "the main function launch(mv, ...)")

    @functools.wraps(function)
    def main(*args: Any) -> Any:
        if args and isinstance(args[0], Multiverse):
            return function(*args)
        if args and args[0] is None:  # launch(None, ...), the brochure's `mv=None`
            args = args[1:]
        return multiverse(function, 1, **options)(*args)

    return main
