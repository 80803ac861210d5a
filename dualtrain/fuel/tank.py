"""Tank: seeded, shuffled, resumable mini-batches from a pack, as NumPy, torch or JAX."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from dualtrain import backends
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.fuel import images
from dualtrain.fuel.columns import ColumnType
from dualtrain.fuel.order import EpochOrder
from dualtrain.fuel.pack import Pack
from dualtrain.fuel.pipeline import Pipeline, Recipe

__all__ = ["Tank"]

_STATE_VERSION = 1
_TARGETS = ("numpy", "torch", "jax")


class Tank:
    """Serves mini-batches of a pack, the same for a seed under any framework and worker count.

    Args:
        data_path: a pack file (.h5, .hdf5, .npz) or a list of its shards.
        data_specf: key -> dtype of each column to serve (``{"image": "uint8", "label":
            "int64"}``); images decode to ``(H, W, C)`` uint8, sequences to ``(T, H, W, C)``.
        batch_size: rows per batch.
        shuffle: a new permutation per (seed, epoch); else pack order.
        in_same_size: every batch full (the last is filled with rows drawn by the seed);
            else the last batch is short.
        fetch_fn: ``fetch_fn(pack, index) -> sample``; the default reads the specified
            columns of the row, decodes images and casts values to their dtypes.
        prep_fn: ``prep_fn(sample) -> sample``, e.g. a Comburant; runs in the workers.
        collate_fn: ``collate_fn(list of samples) -> batch``; the default stacks each key
            into one array (keys of varying shape become lists), inside the workers.
        seed: the seed of shuffling, filling and augmentation.
        to: "numpy", "torch" or "jax": the framework of the batches.
        device: where batches go (a torch device; a JAX device or sharding); None: the host.
        workers: 0 prepares batches in the calling thread; k > 0 uses k workers.
        rank, world: this process's share of each epoch (disjoint, equal across ranks).
        worker_mode: "thread" (default: Pillow and NumPy release the GIL, and no sample is
            pickled) or "process" (for Python-heavy prep_fn; functions must be picklable).
        prefetch: batches prepared ahead when workers > 0.
    """

    def __init__(
        self,
        data_path: str | os.PathLike[str] | Sequence[Any],
        data_specf: Mapping[str, str],
        batch_size: int,
        shuffle: bool = True,
        in_same_size: bool = True,
        fetch_fn: Callable[[Any, int], Any] | None = None,
        prep_fn: Callable[[Any], Any] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        *,
        seed: int = 0,
        to: str = "numpy",
        device: Any = None,
        workers: int = 0,
        rank: int = 0,
        world: int = 1,
        worker_mode: str = "thread",
        prefetch: int = 2,
    ) -> None:
        for name, value, low in (("batch_size", batch_size, 1), ("workers", workers, 0),
                                 ("prefetch", prefetch, 0)):  # fmt: skip
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise bad_argument(name, value, f"an int >= {low}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise bad_argument("seed", seed, "an int")
        if to not in _TARGETS:
            raise bad_argument("to", to, "one of 'numpy', 'torch', 'jax'")
        if worker_mode not in ("thread", "process"):
            raise bad_argument("worker_mode", worker_mode, "'thread' or 'process'")
        if to == "numpy" and device is not None:
            raise bad_argument("device", device, "None when to='numpy'")
        for name, fn in (("fetch_fn", fetch_fn), ("prep_fn", prep_fn), ("collate_fn", collate_fn)):
            if fn is not None and not callable(fn):
                raise bad_argument(name, fn, "a callable or None")
        self.pack = Pack(data_path)
        self.spec = _check_spec(self.pack, data_specf)
        self.batch_size, self.seed, self.to, self.device = batch_size, seed, to, device
        self._order = EpochOrder(
            len(self.pack), batch_size, shuffle=bool(shuffle), full=bool(in_same_size),
            seed=seed, rank=rank, world=world,
        )  # fmt: skip
        fetch = fetch_fn if fetch_fn is not None else _DefaultFetch(self.pack, self.spec)
        recipe = Recipe(self.pack, fetch, prep_fn, seed)
        self._pipeline = Pipeline(recipe, collate_fn, workers, worker_mode, prefetch)
        self._deliver = None if to == "numpy" else backends.load_part(to, "data").Courier(device)
        self.epoch = 0
        self.position = 0  # batches of this epoch already served

    @property
    def MPE(self) -> int:  # noqa: N802 - Nebulae's name: "miles per epoch"
        """Batches per epoch for this rank."""
        return self._order.batches

    def __len__(self) -> int:
        """Rows in the pack."""
        return len(self.pack)

    def _plan(self, key: tuple[int, int]) -> tuple[np.ndarray, tuple[int, int]]:
        epoch, number = key
        after = (epoch, number + 1) if number + 1 < self.MPE else (epoch + 1, 0)
        return self._order.batch(epoch, number), after

    def next(self) -> Any:
        """The next batch, moving on to the next epoch after the last one."""
        batch = self._pipeline.get((self.epoch, self.position), self._plan)
        self.position += 1
        if self.position == self.MPE:
            self.epoch, self.position = self.epoch + 1, 0
        return batch if self._deliver is None else self._deliver(batch)

    __next__ = next

    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch (a whole epoch when none of it was served)."""
        for _ in range(self.MPE - self.position):
            yield self.next()

    def state_dict(self) -> dict[str, int]:
        """Where the Tank stands: enough to resume the identical stream."""
        return {
            "version": _STATE_VERSION, "seed": self.seed, "epoch": self.epoch,
            "position": self.position, "rows": len(self.pack), "batch_size": self.batch_size,
            "rank": self._order.rank, "world": self._order.world,
        }  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes from `state_dict()`: the next batch is the one that would have come next."""
        mine = self.state_dict()
        if not isinstance(state, Mapping) or set(state) != set(mine):
            raise bad_argument("state", state, f"a Tank.state_dict() with keys {sorted(mine)}")
        for key in ("version", "seed", "rows", "batch_size", "rank", "world"):
            if state[key] != mine[key]:
                raise ArgumentError(
                    f"state[{key!r}] must match this Tank's {mine[key]!r}; got {state[key]!r}"
                )
        epoch, position = state["epoch"], state["position"]
        if not isinstance(epoch, int) or epoch < 0 or not 0 <= position < self.MPE:
            raise bad_argument("state", dict(state), f"epoch >= 0 and 0 <= position < {self.MPE}")
        self.epoch, self.position = epoch, position

    def close(self) -> None:
        """Stops the workers and closes the files (a later `next` opens them again)."""
        self._pipeline.close()
        self.pack.close()

    def __enter__(self) -> Tank:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        pipeline = getattr(self, "_pipeline", None)
        if pipeline is not None:
            pipeline.close()


def _check_spec(pack: Pack, spec: Mapping[str, str]) -> dict[str, ColumnType]:
    if not isinstance(spec, Mapping) or not spec:
        raise bad_argument("data_specf", spec, "a non-empty dict of column key -> dtype")
    out: dict[str, ColumnType] = {}
    for key, dtype in spec.items():
        if key not in pack.columns:
            raise bad_argument("data_specf", dict(spec), f"keys among the pack's {pack.keys}")
        ctype = ColumnType.parse(dtype, f"data_specf[{key!r}]")
        kind = pack.columns[key]["kind"]
        if kind in ("image", "sequence") and ctype.base != "uint8":
            raise bad_argument(f"data_specf[{key!r}]", dtype, "'uint8' for an image column")
        out[key] = ctype
    return out


class _DefaultFetch:
    """Reads the specified columns of a row; decodes images, casts values to their dtypes."""

    def __init__(self, pack: Pack, spec: dict[str, ColumnType]) -> None:
        self.spec = spec
        self.kinds = {key: pack.columns[key]["kind"] for key in spec}

    def __call__(self, pack: Pack, index: int) -> dict[str, Any]:
        sample: dict[str, Any] = {}
        for key, ctype in self.spec.items():
            value = pack[key][index]
            kind = self.kinds[key]
            if kind == "image":
                sample[key] = images.decode(value)
            elif kind == "sequence":
                sample[key] = np.stack([images.decode(frame) for frame in value])
            elif ctype.base == "str":
                sample[key] = value
            else:
                sample[key] = np.asarray(value).astype(ctype.dtype, copy=False)
        return sample
