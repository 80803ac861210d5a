"""Multiverse's workers launched and supervised by torch's elastic agent (what torchrun runs).

`launch`, the adapter's `TRAITS.agent`, runs a `Launch`'s workers through
``torch.distributed.launcher.api.elastic_launch``: a ``LocalElasticAgent`` that meets at a c10d
rendezvous on 127.0.0.1, starts the workers with torchrun's variables (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` of the agent's store,
``TORCHELASTIC_RESTART_COUNT`` ...), watches them, stops every worker at the first failure and,
with restarts left, starts them all again. What the workers report (rank 0's result, an
error's step and traceback) travels through the run's folder (`dualtrain.multiverse.launch`),
not through the agent: it passes on exit codes only (a worker that reported its result and
that Multiverse stopped as it hung on its way out is one the agent counts as failed, and
Multiverse does not). The run's variables (`Launch.environment`) are in
``os.environ`` while the agent runs, as the workers it starts inherit it. torch is imported by
`launch` alone, so the traits that name it import none.
"""

from __future__ import annotations

import logging
import signal
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from dualtrain.multiverse.launch import environment
from dualtrain.multiverse.seams import Launch
from dualtrain.multiverse.world import free_port

__all__ = ["launch"]

# The agent logs each start, stop and failure; Multiverse reports failures itself (by rank
# and step), so only the agent's critical lines are shown.
_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def launch(job: Launch) -> dict[int, int]:
    """Runs `job`'s workers on this host under torch's elastic agent (`Agent`).

    `job.timeout` bounds the rendezvous; the agent keeps its per-attempt folders in
    `job.log_dir`.

    Returns:
        {} when every worker returned; else the last attempt's failed ranks and exit codes
        (a negative code: killed by that signal).

    Raises:
        KeyboardInterrupt: Ctrl-C (SIGINT) in this process; the agent stopped the workers.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=job.processes,
        run_id=f"dualtrain-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        rdzv_configs={"timeout": max(1, int(job.timeout))},
        max_restarts=job.max_restarts,
        monitor_interval=0.1,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=job.log_dir),
    )
    try:
        with environment(job.environment), _quiet(), _handlers_kept():
            elastic_launch(config, job.target)(*job.args)
    except ChildFailedError as err:
        return {int(rank): int(failure.exitcode) for rank, failure in err.failures.items()}
    except SignalException as err:
        if err.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise
    return {}


@contextmanager
def _quiet() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


@contextmanager
def _handlers_kept() -> Iterator[None]:
    """The process's signal handlers as they were after the agent (it installs its own)."""
    main = threading.current_thread() is threading.main_thread()
    saved = {sig: signal.getsignal(sig) for sig in _SIGNALS} if main else {}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)
