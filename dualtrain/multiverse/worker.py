"""The body each spawned worker runs: join the world, run the universe, report to the parent."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from dualtrain.multiverse.launch import (
    end_group,
    own_group,
    report_failure,
    report_result,
    watch_parent,
)


def run_worker(
    conn: Any, rank: int, parent: int, multiverse: Callable[..., Any],
    universe: Callable[..., Any], config: dict[str, Any], args: tuple[Any, ...], steps: Any,
) -> None:  # fmt: skip
    """A spawned worker's body: join, run the universe, report; never outlive the parent.

    `multiverse` is the Multiverse class, passed (by reference) rather than imported: the
    facade imports this module.
    """
    own_group()  # what it starts (Tank workers, pools) is stopped with it
    watch_parent(parent)
    mv: Any = None
    try:
        mv = multiverse(universe, **config)
        mv._steps = steps
        mv._join_early()
        result = universe(mv, *args)
    except BaseException as err:  # everything reaches the parent, Ctrl-C too
        report_failure(conn, mv.step if mv is not None else 0, err)
        conn.close()
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        end_group(signal.SIGTERM)  # its children; the parent SIGKILLs what stays
        os._exit(1)  # no atexit: a process group left mid-collective can hang its teardown
    # Reported before leaving: a teardown that hangs is then the parent's to end.
    report_result(conn, mv.step, result if rank == 0 else None)
    conn.close()
    mv.leave()
