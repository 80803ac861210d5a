"""A TimeMachine for a data-parallel run: rank 0 writes each anchor once, every rank reads.

Writing (``drop``, ``drop_members``, ``drop_embeddings``) runs on rank 0 alone, retention
included, and the other ranks wait for it: every rank returns the same path, or raises the
same error when rank 0's write failed. The one exception is ``drop_embeddings`` of a store
sharded by ``mv.sync(store)``: each rank holds only its rows, so every rank writes its part
and rank 0 the manifest that commits them (``checkpoint.embedding_sets``, a collective that
raises any rank's error on every rank) (nothing is half-written: TimeMachine writes to a
temporary name and renames). Reading (``to``, ``to_members``, ``to_embeddings``) waits
until every rank has arrived and again until every rank has read, and a write waits until
every rank has arrived, so no rank reads an anchor while rank 0 replaces it or retention
deletes it: every rank loads the same file into its own model.
"""

from __future__ import annotations

from typing import Any, Protocol

from dualtrain.errors import CheckpointError
from dualtrain.multiverse.seams import Runtime

__all__ = ["RankZeroTimeMachine", "Run"]

_WRITES = ("drop", "drop_members", "drop_embeddings")
_READS = ("to", "to_members", "to_embeddings")


class Run(Protocol):
    """What a RankZeroTimeMachine uses of its Multiverse."""

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the one that writes."""
        ...

    @property
    def runtime(self) -> Runtime:
        """The joined run."""
        ...

    def barrier(self) -> None:
        """Waits until every process reaches it."""
        ...


class RankZeroTimeMachine:
    """`machine` (a TimeMachine) with writes on rank 0 only and reads after a barrier.

    Other attributes (``save_path``, ``max_anchors``, ...) are the machine's own.
    """

    def __init__(self, machine: Any, mv: Run) -> None:
        self.machine, self._mv = machine, mv

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.machine, name)
        if name in _WRITES:
            return lambda model, *args, **kw: (
                self._write_every(name, model, args, kw)
                if _sharded(model)
                else self._write(name, model, args, kw)
            )
        if name in _READS:
            return lambda model, *args, **kw: self._read(name, model, args, kw)
        return value

    def _write(self, name: str, model: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        mv = self._mv
        mv.barrier()  # no rank still reads what this write may replace or retention delete
        outcome: tuple[str, Any] = ("ok", None)
        if mv.is_main:
            try:
                outcome = ("ok", getattr(self.machine, name)(_unwrap(mv, model), *args, **kw))
            except Exception as err:  # every rank must learn of it, or they wait for good
                outcome = ("error", f"{type(err).__name__}: {err}")
                mine: BaseException | None = err
            else:
                mine = None
        kind, value = mv.runtime.gather_object(outcome)[0]
        if kind == "error":
            if mv.is_main and mine is not None:
                raise mine
            raise CheckpointError(f"rank 0 failed to write the anchor ({name}): {value}")
        return value

    def _write_every(self, name: str, rows: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        """A sharded store's anchor: every rank writes its part (the machine's collective)."""
        self._mv.barrier()  # no rank still reads what this write may replace
        return getattr(self.machine, name)(rows, *args, **kw)

    def _read(self, name: str, model: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        self._mv.barrier()  # every rank is here: no write is under way
        try:
            return getattr(self.machine, name)(_unwrap(self._mv, model), *args, **kw)
        finally:
            self._mv.barrier()  # and no later write starts before every rank has read


def _sharded(model: Any) -> bool:
    """Whether `model` is the attachment of a store sharded across the run's processes."""
    return getattr(getattr(model, "store", None), "shard", None) is not None


def _unwrap(mv: Run, model: Any) -> Any:
    """The model without the run's wrapping (DDP's ``.module``); rows and others as given."""
    return mv.runtime.unwrap(model)
