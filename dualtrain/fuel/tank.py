"""Tank: seeded, shuffled, resumable mini-batches from a pack, as NumPy, torch or JAX."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from dualtrain import backends
from dualtrain.deprecation import moved
from dualtrain.errors import ArgumentError, PackError, bad_argument
from dualtrain.fuel.casts import check_floats, check_spec
from dualtrain.fuel.columns import ColumnType
from dualtrain.fuel.decoded import PackFetch
from dualtrain.fuel.fetch import DefaultFetch
from dualtrain.fuel.finish import Finish
from dualtrain.fuel.gather import ColumnGather
from dualtrain.fuel.order import EpochOrder
from dualtrain.fuel.pack import Pack
from dualtrain.fuel.pipeline import Pipeline, Recipe
from dualtrain.fuel.preloading import Lead, cached_fetch, preload_settings
from dualtrain.fuel.seams import data_part
from dualtrain.preload import PreloadCache
from dualtrain.preload.cache import check_count
from dualtrain.validate import check_seed

__all__ = ["Tank"]

_STATE_VERSION = 1
EPOCH_LIMIT = 2**63  # epochs a state may name (the order's and augmentations' streams' word)
_TARGETS = ("numpy", "torch", "jax")
_LAYOUTS = ("NHWC", "NCHW")
_UNCHANGED: Any = object()  # shard(device=...) not given


class Tank:
    """Serves mini-batches of a pack, the same for a seed under any framework and worker count.

    One epoch of a rank serves `batches_per_epoch` batches. Its rows are a share of the
    pack, n // world rows (all n with one rank), each once, plus, by the end mode:

    - default (``in_same_size=True``): the last batch filled with rows of the share drawn
      by the seed, so every batch is full and a few rows come twice (80 rows, batch 32:
      3 batches, 96 samples). For training.
    - ``in_same_size=False``: a short last batch (32, 32, 16).
    - ``drop_last=True``: the incomplete last batch left out (32, 32: 16 rows unseen).
    - ``pad=True``: evaluation. Every row of the pack once over all ranks (the n % world
      rows included); the last batch padded to full size with repeated rows, and a boolean
      column ``"mask"`` (or the name `pad` gives) False on padding. Every batch keeps one
      shape, and ``batch["mask"].sum()`` over an epoch counts each row once.

    Args:
        data_path: a pack file (.h5, .hdf5, .npz) or a list of its shards (of one
            `generate` run: shards of different runs, or a missing or repeated shard, are a
            PackError).
        data_specf: key -> dtype of each column to serve (``{"image": "uint8", "label":
            "int64"}``); images decode to ``(H, W, C)`` uint8, sequences to ``(T, H, W, C)``.
            A dtype that cannot hold every stored value (int16 as int8, float64 as float16,
            int as uint, float as int) is refused unless `cast` allows it.
        batch_size: rows per batch.
        shuffle: a new permutation per (seed, epoch); else pack order.
        in_same_size: every batch full (the last is filled with rows drawn by the seed);
            else the last batch is short. `drop_last` and `pad` replace it.
        fetch_fn: ``fetch_fn(data, index) -> sample``, where ``data[key][i]`` is a cell of
            the pack with images decoded (a `dualtrain.fuel.decoded.DecodedPack`; its
            ``raw`` is the Pack, whose image cells are the encoded bytes). The default
            reads the specified columns of the row, decodes images and casts values to
            their dtypes; with no fetch_fn, prep_fn, collate_fn or preload, numeric
            columns of one shape are read for the whole batch by one gather each
            (`Pack.take`), with the same values, dtypes and errors (docs/fuel.md).
        prep_fn: ``prep_fn(sample) -> sample``, e.g. a Comburant; runs in the workers.
        collate_fn: ``collate_fn(list of samples) -> batch``; the default stacks each key
            into one array (keys of varying shape become lists), inside the workers.
        seed: the seed of shuffling, filling and augmentation.
        to: "numpy", "torch" or "jax": the framework of the batches.
        device: where batches go (a torch device; a JAX device or sharding); None: the host.
            A device that is not there (``"cuda"`` without CUDA) fails here.
        workers: 0 prepares batches in the calling thread; k > 0 uses k workers.
        rank, world: this process's share of each epoch (disjoint, equal across ranks).
        worker_mode: "thread" (default: Pillow and NumPy release the GIL, and no sample is
            pickled) or "process" (for Python-heavy prep_fn; functions must be picklable).
        prefetch: batches prepared ahead when workers > 0.
        drop_last: leave out the incomplete last batch of each epoch.
        pad: True or a key: pad the last batch and add a boolean mask column under that key
            (True: ``"mask"``); a pack column of that name is refused.
        cast: which narrowing of `data_specf` is allowed: "safe" (default: none; NumPy's
            ``can_cast(stored, wanted, "safe")``), "same_kind" (int64 as int32, float64 as
            float32; each served value is checked to survive the cast, else PackError), or
            "unsafe" (NumPy's astype, unchecked). A dict gives it per column.
        layout: "NHWC" (default) or "NCHW": images ``(C, H, W)`` (sequences
            ``(T, C, H, W)``) after prep_fn, so batches feed ``dock.Conv`` as they come.
            prep_fn must leave them channel-last, of any channel count (one with the
            pack's count at axis -3 but not -1 is a ShapeError naming it and the row).
        scale: None, a finite number, or a dict key -> number: images multiplied by it as
            float32 after prep_fn, whatever real dtype it returns (``scale=1 / 255`` gives
            [0, 1]); refused unless every pixel of the pack's depth times it is a finite,
            normal float32, and floats (or other integers) prep_fn returns are checked per
            pixel the same way.
        preload: cache fetch_fn's output (decoded rows, before prep_fn) within a byte
            budget, loading the rows of coming batches ahead in this Tank's order
            (docs/preload.md): False (default), True (a quarter of the available memory),
            a budget in bytes, or a dict of ``max_memory_size``, ``preloaded_data`` (rows
            ahead; default the rows of the batches being prepared plus one batch),
            ``threads``, ``copy``, ``sizeof``. The batches are the same as without it;
            fetch_fn must be a plain read (a random draw there is an error). `preloader`
            is the cache (``stats()``).
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
        drop_last: bool = False,
        pad: bool | str = False,
        cast: str | Mapping[str, str] = "safe",
        layout: str = "NHWC",
        scale: float | Mapping[str, float] | None = None,
        preload: bool | int | Mapping[str, Any] = False,
    ) -> None:
        batch_size = check_count("batch_size", batch_size, 1)
        preload_kw = preload_settings(preload)
        workers, prefetch = check_count("workers", workers, 0), check_count("prefetch", prefetch, 0)
        rank, world = check_count("rank", rank, 0), check_count("world", world, 1)
        seed = check_seed("seed", seed)
        for name, flag in (("shuffle", shuffle), ("in_same_size", in_same_size),
                           ("drop_last", drop_last)):  # fmt: skip
            if not isinstance(flag, (bool, np.bool_)):
                raise bad_argument(name, flag, "a bool")
        if not (isinstance(pad, (bool, np.bool_)) or (isinstance(pad, str) and pad)):
            raise bad_argument("pad", pad, "a bool, or the key of the mask column")
        mask_key = ("mask" if pad is True or pad is np.True_ else pad) if pad else None
        if mask_key is not None and drop_last:
            raise ArgumentError("drop_last and pad exclude each other; choose one")
        if to not in _TARGETS:
            raise bad_argument("to", to, "one of 'numpy', 'torch', 'jax'")
        if worker_mode not in ("thread", "process"):
            raise bad_argument("worker_mode", worker_mode, "'thread' or 'process'")
        if to == "numpy" and device is not None:
            raise bad_argument("device", device, "None when to='numpy'")
        if layout not in _LAYOUTS:
            raise bad_argument("layout", layout, f"one of {_LAYOUTS}")
        for name, fn in (("fetch_fn", fetch_fn), ("prep_fn", prep_fn), ("collate_fn", collate_fn)):
            if fn is not None and not callable(fn):
                raise bad_argument(name, fn, "a callable or None")
        # The device before the files: a missing device fails here, not at the first batch.
        deliver = None if to == "numpy" else data_part(to).Courier(device)
        self.pack = Pack(data_path)
        if len(self.pack) == 0:
            raise PackError(f"data_path: the pack {self.pack.paths} is empty (0 rows)")
        self.spec = check_spec(self.pack, data_specf, cast)
        if to != "numpy":
            check_floats(self.spec, backends.load(to))
        if mask_key is not None and (mask_key in self.pack.columns or mask_key in self.spec):
            raise bad_argument(
                "pad", pad, f"a mask key that is not a pack column ({self.pack.keys}): "
                "pass pad='<another name>'"
            )  # fmt: skip
        finish = Finish(self.pack, self.spec, layout, scale)
        self.batch_size, self.seed, self.to, self.device = batch_size, seed, to, device
        self.mask_key, self.layout = mask_key, layout
        last = "pad" if mask_key else "drop" if drop_last else None
        self._order = EpochOrder(
            len(self.pack), batch_size, shuffle=bool(shuffle), full=bool(in_same_size),
            seed=seed, rank=rank, world=world, last=last,
        )  # fmt: skip
        # Without callbacks or a cache, numeric columns of one shape are read a batch at a
        # time (one gather each); only what needs decoding is read row by row.
        gather = None
        by_row = self.spec
        if fetch_fn is None and prep_fn is None and collate_fn is None and preload_kw is None:
            gather = ColumnGather(self.pack, self.spec)
            by_row = {k: v for k, v in self.spec.items() if k not in gather.spec}
        # A custom fetch_fn reads a DecodedPack: ``data["image"][i]`` is the decoded image.
        fetch: Callable[[Any, int], Any] | None = (
            PackFetch(fetch_fn) if fetch_fn is not None
            else DefaultFetch(self.pack, by_row) if by_row else None
        )  # fmt: skip
        self.preloader: PreloadCache | None = None
        if preload_kw is not None:
            assert fetch is not None  # a cache reads every column row by row
            processes = workers > 0 and worker_mode == "process"
            window = batch_size * ((prefetch + 2) if workers else 2)  # pipeline + 1 batch
            self.preloader, fetch = cached_fetch(preload_kw, fetch, self.pack, processes, window)
        recipe = Recipe(
            self.pack, fetch, prep_fn, seed, finish_fn=finish if finish.keys else None,
            dict_samples=collate_fn is None or finish.keys != {},
            fixed=_fixed(self.pack, self.spec),
            gather=gather if gather is not None and gather.keys else None, keys=tuple(self.spec),
            whole_row=DefaultFetch(self.pack, self.spec) if gather is not None else None,
        )  # fmt: skip
        # One look-ahead: the pipeline plans the batches, the cache's threads load their rows.
        cache = self.preloader
        lead = Lead(cache, self.pack) if cache is not None and cache.threads else None
        self._pipeline = Pipeline(recipe, collate_fn, workers, worker_mode, prefetch, lead)
        self._deliver = deliver
        self.epoch = 0
        self.position = 0  # batches of this epoch already served

    @property
    def batches_per_epoch(self) -> int:
        """Batches per epoch for this rank (see the class docstring for what they hold)."""
        return self._order.batches

    @property
    def MPE(self) -> int:  # noqa: N802 - Nebulae's name: "miles per epoch"
        """Deprecated: `batches_per_epoch` (Nebulae's Tank, with MPE, is in compat)."""
        moved(
            "Tank.MPE",
            "Tank.batches_per_epoch, or dualtrain.compat.nebulae.fuel.depot.Tank (Nebulae's, "
            "which keeps MPE)",
        )
        return self._order.batches

    @property
    def rows_per_epoch(self) -> int:
        """Distinct rows of the pack this rank serves in one epoch, each once."""
        return self._order.rows_per_epoch

    @property
    def samples_per_epoch(self) -> int:
        """Samples this rank serves in one epoch: rows plus fill or padding."""
        return self._order.samples_per_epoch

    def __len__(self) -> int:
        """Rows in the pack (not batches: see `batches_per_epoch`)."""
        return len(self.pack)

    def shard(self, rank: int, world: int, *, device: Any = _UNCHANGED) -> None:
        """Serves this process's share from now on: rank `rank` of `world` (Multiverse.sync).

        The stream is the one ``Tank(..., rank=rank, world=world)`` serves, from the start of
        the current epoch; `device`, when given, replaces where batches go. Only at the start
        of an epoch (a share cut mid-epoch would serve some rows twice, others never).

        Raises:
            ArgumentError: a rank or world out of range, a world larger than the pack, a
                Tank part-way through an epoch, or a device that is not there.
        """
        self.apply_shard(self.plan_shard(rank, world, device))

    def plan_shard(self, rank: int, world: int, device: Any = _UNCHANGED) -> tuple[Any, ...]:
        """Everything `shard` changes, checked, with nothing changed yet (`apply_shard` it).

        Multiverse.sync plans every Tank's share before it changes any. The plan's first
        item is the share's order (``batches``, ``batch_size``, ``samples_per_epoch``), its
        last the device.
        """
        rank, world = check_count("rank", rank, 0), check_count("world", world, 1)
        if self.position != 0:
            raise ArgumentError(
                f"shard() only at the start of an epoch; this Tank has served {self.position} "
                f"of epoch {self.epoch}'s {self.batches_per_epoch} batches"
            )
        old = self._order
        order = EpochOrder(
            old.n, old.batch_size, shuffle=old.shuffle, full=old.full, seed=old.seed,
            rank=rank, world=world, last=old.last,
        )  # fmt: skip
        deliver = self._deliver
        if device is _UNCHANGED:
            device = self.device
        elif self.to == "numpy" and device is not None:
            raise bad_argument("device", device, "None when to='numpy'")
        elif self.to != "numpy":
            deliver = data_part(self.to).Courier(device)
        return order, deliver, device

    def apply_shard(self, share: tuple[Any, ...]) -> None:
        """Serves the share `plan_shard` planned from now on."""
        self._pipeline.cancel()  # batches prepared for the old share
        self._order, self._deliver, self.device = share

    def _plan(self, key: tuple[int, int]) -> tuple[np.ndarray, tuple[int, int]]:
        epoch, number = key
        after = (epoch, number + 1) if number + 1 < self.batches_per_epoch else (epoch + 1, 0)
        return self._order.batch(epoch, number), after

    def next(self) -> Any:
        """The next batch, moving on to the next epoch after the last one."""
        number = self.position
        batch = self._pipeline.get((self.epoch, self.position), self._plan)
        if self.mask_key is not None:
            if not isinstance(batch, dict) or self.mask_key in batch:
                raise ArgumentError(
                    f"pad={self.mask_key!r} adds the key {self.mask_key!r} to dict batches; "
                    f"the batch is a {type(batch).__name__}"
                    + (" holding that key already" if isinstance(batch, dict) else "")
                )
            batch[self.mask_key] = self._order.valid(number)
        self.position += 1
        if self.position == self.batches_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
        return batch if self._deliver is None else self._deliver(batch)

    __next__ = next

    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch (a whole epoch when none of it was served)."""
        for _ in range(self.batches_per_epoch - self.position):
            yield self.next()

    def state_dict(self) -> dict[str, Any]:
        """Where the Tank stands: enough to resume the identical stream."""
        return {
            "version": _STATE_VERSION, "seed": self.seed, "epoch": self.epoch,
            "position": self.position, "rows": len(self.pack), "batch_size": self.batch_size,
            "rank": self._order.rank, "world": self._order.world, "last": self._order.last,
            # Row i of the stream depends on the shards and their order: resume over the same.
            "shuffle": self._order.shuffle, "files": self.pack.shards,
        }  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes from `state_dict()`: the next batch is the one that would have come next.

        Every setting that changes the stream must match this Tank's (seed, rows, batch
        size, rank, world, end mode, shuffle, the shards and their order), else
        ArgumentError naming it. A state saved before a setting was recorded (no
        ``"last"``, ``"shuffle"`` or ``"files"``) is taken as this Tank's for it.
        """
        mine = self.state_dict()
        if isinstance(state, Mapping):
            state = {**{k: mine[k] for k in _LATER_KEYS if k not in state}, **state}
        if not isinstance(state, Mapping) or set(state) != set(mine):
            raise bad_argument("state", state, f"a Tank.state_dict() with keys {sorted(mine)}")
        state = {**state, "files": _as_lists(state["files"])}
        for key in ("version", "seed", "rows", "batch_size", "rank", "world", "last",
                    "shuffle", "files"):  # fmt: skip
            if state[key] != mine[key]:
                raise ArgumentError(
                    f"state[{key!r}] must match this Tank's {mine[key]!r}; got {state[key]!r}"
                )
        epoch, position = state["epoch"], state["position"]
        # The epoch is a 64-bit word of the order's and the augmentations' Philox counters;
        # 2**63 leaves room to count epochs on from it.
        if not _is_int(epoch) or not 0 <= epoch < EPOCH_LIMIT:
            raise bad_argument("state['epoch']", epoch, "an int in [0, 2**63)")
        if not _is_int(position) or not 0 <= position < self.batches_per_epoch:
            raise bad_argument(
                "state['position']", position, f"an int in [0, {self.batches_per_epoch})"
            )
        self.epoch, self.position = int(epoch), int(position)

    def close(self) -> None:
        """Stops the workers and closes the files (a later `next` opens them again)."""
        self._pipeline.close()
        if self.preloader is not None:
            self.preloader.close()
        self.pack.close()

    def __enter__(self) -> Tank:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        pipeline = getattr(self, "_pipeline", None)
        if pipeline is not None:
            pipeline.close()


# State keys added after version 1 states were first written; older states lack them.
_LATER_KEYS = ("last", "shuffle", "files")


def _as_lists(files: Any) -> Any:
    """A state's shard list with tuples as lists (a state may have been through JSON or not)."""
    if isinstance(files, (list, tuple)):
        return [list(f) if isinstance(f, (list, tuple)) else f for f in files]
    return files


def _fixed(pack: Pack, spec: Mapping[str, Any]) -> frozenset[str]:
    """The served columns of one shape in every row: images (not sequences), fixed values."""
    out = set()
    for key in spec:
        entry = pack.columns[key]
        if entry["kind"] == "image" or (
            entry["kind"] == "value" and not ColumnType.parse(entry["type"]).variable
        ):
            out.add(key)
    return frozenset(out)


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
