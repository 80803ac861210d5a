"""The errors dualtrain raises.

Every error derives from `DualtrainError`; most also derive from the matching builtin,
so ``except ValueError`` keeps working. Messages follow one house form: the argument,
the value received, and what was expected::

    batch_size must be a positive int; got batch_size=0
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ArgumentError",
    "BackendError",
    "CheckpointError",
    "DtypeError",
    "DualtrainError",
    "NotRealizedError",
    "PackError",
    "PrecisionWarning",
    "ShapeError",
    "TankWorkerError",
    "WorkerError",
    "bad_argument",
    "OutOfRangeError",
    "IsolationError",
    "RegisteredModuleError",
]


class DualtrainError(Exception):
    """Base class of every error dualtrain raises."""


class ArgumentError(DualtrainError, ValueError):
    """An argument has a value outside what the function accepts."""


class ShapeError(DualtrainError, ValueError):
    """An array has the wrong shape, rank or strides."""


class DtypeError(DualtrainError, TypeError):
    """An array has a dtype the operation cannot take, or a value does not fit a dtype."""


class BackendError(DualtrainError, TypeError):
    """An array belongs to no known framework, or arrays of several frameworks were mixed."""


class PackError(DualtrainError, ValueError):
    """A row of a pack's file list is bad: the message names the file, line and column."""


class PrecisionWarning(UserWarning):
    """A conversion narrowed a dtype (float64 -> float32) because the target cannot hold it."""


def bad_argument(name: str, value: object, expected: str) -> ArgumentError:
    """Builds the house error: ``{name} must be {expected}; got {name}={value!r}``."""
    return ArgumentError(f"{name} must be {expected}; got {name}={value!r}")


class OutOfRangeError(ArgumentError, IndexError):
    """An index or row id lies outside the range it indexes (an Embedding's or a store's).

    It is also an IndexError, what torch and NumPy raise for the same mistake.
    """


class CheckpointError(DualtrainError, ValueError):
    """A checkpoint does not fit the model, or is not a (whole, intact) dualtrain checkpoint."""


class NotRealizedError(DualtrainError, RuntimeError):
    """A Craft or dock layer was called outside a realized module."""


class IsolationError(DualtrainError, RuntimeError):
    """Members of a batched model influenced each other (an op mixed them): see docs/batching.md."""


class RegisteredModuleError(DualtrainError, RuntimeError):
    """A registered batch module (torchmb compat) disagrees with the generic batched path."""


class WorkerError(DualtrainError, RuntimeError):
    """A Multiverse worker raised, died or timed out; the message names its rank and step.

    Attributes:
        rank: the failed worker's rank.
        step: the training steps it had finished (its learner's steps or DDP forwards).
    """

    def __init__(self, message: str, rank: int, step: int) -> None:
        super().__init__(message)
        self.rank, self.step = rank, step

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.rank, self.step))


class TankWorkerError(DualtrainError, RuntimeError):
    """A Tank's worker process died while preparing a batch; names the batch and its rows.

    Attributes:
        epoch, batch: the batch in flight (its number within the epoch).
        rows: the pack rows that batch was preparing.
    """

    def __init__(self, message: str, epoch: int, batch: int, rows: list[int]) -> None:
        super().__init__(message)
        self.epoch, self.batch, self.rows = epoch, batch, rows

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.epoch, self.batch, self.rows))
