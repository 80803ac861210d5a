"""Preload: a decode-heavy dataset for 3 epochs, plain against the preload cache, in one run.

The workload: N JPEG files (256x256 RGB, smooth colour fields with noise drawn with NumPy,
Pillow quality 90, ~30 KiB each) made at run time in a temporary folder, labels i % 10.
Per sample: decode the JPEG with Pillow and resize it to 128x128 (bilinear). N is 1500
(``--quick``: 160). Every case runs 3 epochs, shuffled, batch 32; samples/s per epoch. The
contenders, in this order, each built fresh (a new cache), one after the other in the same
process:

DataLoader (torch, ``num_workers=0`` unless said), a map dataset whose ``__getitem__`` opens
the file, decodes, resizes and returns ``(uint8 CHW tensor, label)``:

- ``DataLoader plain``: the dataset, ``shuffle=True``.
- ``DataLoader preload fits``: ``dualtrain.Preloader(ds, max_memory_size=budget)`` (the
  wrapper spelling; ``@accelerate_dataset`` builds the same Preloader), fed by
  ``preloader.sampler(RandomSampler(ds))`` so the cache loads ahead in the sampler's own
  order; a budget of 1.5x the bytes of all items.
- ``DataLoader preload half``: the same with half the bytes of all items (as the cache counts
  them, measured by the "fits" case): resident bytes must stay within it
  (``peak_resident_bytes`` asserted), and it must still beat plain.
- ``DataLoader 2w plain`` / ``DataLoader 2w preload fits`` (``num_workers=2``, fork, not
  persistent: workers start again every epoch; the cache is shared through /dev/shm), the
  decorator spelling: ``@accelerate_dataset(max_memory_size=budget, ...)`` on a subclass of
  the dataset; ``... threads=0``: the same with no loader threads in the main process (the
  sampler's plan reaches the main process's cache only, whose loads the workers never see).
  ``--no-workers`` skips these three.

Tank over a pack of the same files made by ``dualtrain.FuelGenerator`` (256x256, JPEG
quality 90), ``workers=0``, ``to="torch"``, ``layout="NCHW"``, batch 32, shuffled; the cache
holds fetch_fn's output (``preload={"max_memory_size": budget, ...}``), two ways:

- ``Tank prep-resize``: the default fetch reads the row and decodes the JPEG (what the
  cache holds, 256x256); ``prep_fn`` resizes to 128x128 with Pillow every epoch, on a fresh
  copy of the cached row. The cache saves the decode only.
- ``Tank fetch-resize``: a fetch_fn that reads, decodes and resizes (the dataset's work; a
  deterministic fetch is what the cache may hold); no prep_fn.

Each: ``plain`` (no preload), ``fits`` (1.5x all rows' bytes), ``half`` (half the bytes the
fits case held).

Threads: ``--threads`` (default 1) pins torch (``torch.set_num_threads``), OMP, MKL, OpenBLAS
and XLA; the cache's loader threads are ``--preload-threads`` (default 2); Pillow decodes in
the thread that calls it. So a plain case decodes on one core, a preloaded first epoch on up
to ``--preload-threads`` + 1 threads: epoch 1 is faster partly because it uses more cores.
The speed-up of epochs 2 and 3 is the cache's.

Reported per case: samples/s of epochs 1, 2, 3; the mean of epochs 2-3 over the mean of
the plain case's 3 epochs of the same family (DataLoader 0 workers, DataLoader 2 workers,
Tank prep-resize, Tank fetch-resize); resident, peak resident and budget bytes; hit rate of
epochs 2-3 (hits over gets, from ``stats()`` deltas); seconds the consumer waited for data
(all epochs). Targets (issue 14): epochs 2+ >= 5x plain when the data fits; peak resident
<= budget when it does not, and still faster than plain.

    ./dev bench preload [--threads 1] [--quick] [--images N] [--preload-threads 2]
                        [--preloaded-data 64] [--no-workers]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness


def _options(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """This benchmark's own options; the rest goes to `harness.parse_args`."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--images", type=int, default=None, help="N (default 1500, quick 160)")
    parser.add_argument("--preload-threads", type=int, default=2)
    parser.add_argument("--preloaded-data", type=int, default=64)
    parser.add_argument("--no-workers", action="store_true", help="skip the 2-worker rows")
    own, rest = parser.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:
        parser.print_help()
    if (own.images is not None and own.images < 64) or own.preload_threads < 1:
        parser.error("--images must be >= 64 and --preload-threads >= 1")
    if own.preloaded_data < 1:
        parser.error("--preloaded-data must be >= 1")
    return own, rest


OWN, REST = _options()
args = harness.parse_args("preload", REST)  # pins threads before torch is imported

import csv  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import PIL  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.data import DataLoader, Dataset, RandomSampler  # noqa: E402

import dualtrain  # noqa: E402
from dualtrain.fuel import FuelGenerator, Tank, decode  # noqa: E402
from dualtrain.preload.sizes import nbytes  # noqa: E402

harness.set_torch_threads(args.threads)

N = OWN.images or (160 if args.quick else 1500)
EPOCHS, BATCH, SIDE, OUT = 3, 32, 256, 128
PRELOAD_THREADS, AHEAD = OWN.preload_threads, OWN.preloaded_data


def make_jpegs(folder: str) -> str:
    """N 256x256 JPEGs (colour fields with noise, quality 90) and their CSV list."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:SIDE, 0:SIDE]
    rows = [["image", "label"]]
    for i in range(N):
        planes = [(xx * (i % 7 + 1) + yy * (c + 1) * (i % 3 + 1) + 31 * i) % 256 for c in range(3)]
        pixels = np.clip(np.stack(planes, -1) + rng.normal(0, 6, (SIDE, SIDE, 3)), 0, 255)
        Image.fromarray(pixels.astype(np.uint8)).save(f"{folder}/{i}.jpg", quality=90)
        rows.append([f"{i}.jpg", str(i % 10)])
    with open(f"{folder}/list.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return f"{folder}/list.csv"


class JpegFolder(Dataset):
    """The decode-heavy map dataset: open, decode, resize to 128x128, CHW uint8 tensor."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with Image.open(f"{self.folder}/{i}.jpg") as img:
            small = img.convert("RGB").resize((OUT, OUT), Image.Resampling.BILINEAR)
        return torch.from_numpy(np.array(small)).permute(2, 0, 1).contiguous(), i % 10


def resize(sample: dict[str, Any]) -> dict[str, Any]:
    """The Tank's prep_fn: the decoded 256x256 row resized to 128x128 (every epoch)."""
    small = Image.fromarray(sample["image"]).resize((OUT, OUT), Image.Resampling.BILINEAR)
    return {**sample, "image": np.array(small)}


# -- one case: 3 timed epochs ------------------------------------------------------------


def _epochs(run_epoch: Callable[[], int], stats: Callable[[], dict] | None) -> dict[str, Any]:
    rates, snapshots = [], []
    for _ in range(EPOCHS):
        gc.collect()
        start = time.perf_counter()
        count = run_epoch()
        rates.append(count / (time.perf_counter() - start))
        snapshots.append(stats() if stats else None)
    return {"rates": rates, "stats": snapshots}


def _count_loader(loader: DataLoader) -> Iterator[int]:
    while True:
        yield sum(len(images) for images, _ in loader)


def dataloader_case(
    folder: str, budget: int | None, workers: int = 0, threads: int = PRELOAD_THREADS
) -> dict[str, Any]:
    """3 epochs of a DataLoader: plain (`budget` None), else through the preload cache.

    0 workers: the wrapper spelling, ``Preloader(ds, ...)``; 2 workers: the decorator,
    ``accelerate_dataset(...)`` on a subclass, so both spellings run.
    """
    ds = JpegFolder(folder)
    if budget is None:
        loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers)
        counts = _count_loader(loader)
        return _epochs(lambda: next(counts), None)
    settings = {"max_memory_size": budget, "preloaded_data": AHEAD, "threads": threads}
    if workers == 0:
        data: Any = dualtrain.Preloader(ds, **settings)
        pre = data
    else:

        @dualtrain.accelerate_dataset(**settings)
        class Decorated(JpegFolder):
            pass

        data = Decorated(folder)
        pre = data.preloader
    sampler = pre.sampler(RandomSampler(ds))
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, num_workers=workers)
    counts = _count_loader(loader)
    out = _epochs(lambda: next(counts), pre.stats)
    for i in (0, N // 2, N - 1):  # the cache serves the source's items
        mine, theirs = data[i], ds[i]
        assert torch.equal(mine[0], theirs[0]) and mine[1] == theirs[1], f"item {i} differs"
    out["item_bytes"] = nbytes(ds[0])
    pre.close()
    return out


def fetch_small(pack: Any, index: int) -> dict[str, Any]:
    """A Tank fetch_fn doing the dataset's work: read the row, decode, resize to 128x128."""
    small = Image.fromarray(decode(pack["image"][index])).resize(
        (OUT, OUT), Image.Resampling.BILINEAR
    )
    return {"image": np.array(small), "label": np.int64(pack["label"][index])}


def tank_case(pack: str, budget: int | None, resize_in: str) -> dict[str, Any]:
    preload: Any = False
    if budget is not None:
        preload = {"max_memory_size": budget, "preloaded_data": AHEAD, "threads": PRELOAD_THREADS}
    spec = {"image": "uint8", "label": "int64"}
    fns = {"prep_fn": resize} if resize_in == "prep" else {"fetch_fn": fetch_small}
    with Tank(
        pack, spec, BATCH, to="torch", layout="NCHW", workers=0, seed=0, preload=preload, **fns
    ) as tank:

        def epoch() -> int:
            return sum(len(batch["image"]) for batch in tank)

        cache = tank.preloader
        return _epochs(epoch, cache.stats if cache is not None else None)


# -- the table -----------------------------------------------------------------------------

STAT_KEYS = ("hits", "prefetch_waits", "misses")


def _later_hit_rate(snaps: list[dict]) -> float:
    """Hits over gets in epochs 2-3 (deltas of the cumulative counters)."""
    gets = lambda s: sum(s[k] for k in STAT_KEYS)  # noqa: E731
    done = gets(snaps[-1]) - gets(snaps[0])
    return (snaps[-1]["hits"] - snaps[0]["hits"]) / done if done else 0.0


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def main() -> None:
    load_before = os.getloadavg()
    tmp = tempfile.mkdtemp(prefix="dualtrain-bench-preload-")
    try:
        start = time.perf_counter()
        listing = make_jpegs(tmp)
        made_s = time.perf_counter() - start
        jpeg_kib = sum(os.path.getsize(f"{tmp}/{i}.jpg") for i in range(N)) / N / 1024
        gen = FuelGenerator(file_dir=tmp, file_list=listing, dtype=["vuint8", "int64"])
        pack = f"{tmp}/pack.h5"
        start = time.perf_counter()
        gen.generate(pack, SIDE, SIDE, quality=90, keep_exif=False, workers=args.threads)
        pack_s = time.perf_counter() - start
        print(f"{N} JPEGs ({jpeg_kib:.1f} KiB each) in {made_s:.1f} s, pack in {pack_s:.1f} s")
        results = run_cases(tmp, pack)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(results, load_before, jpeg_kib)


def run_cases(folder: str, pack: str) -> dict[str, dict[str, Any]]:
    # Budgets "fits": 1.5x every item's bytes (computed from one item or row); "half": half
    # of the bytes the fits case held at the end, as the cache counts them.
    results: dict[str, dict[str, Any]] = {}

    def run(name: str, family: str, budget: int | None, fn: Callable, *a: Any) -> None:
        print(f"running {name} ...", flush=True)
        results[name] = {**fn(*a), "family": family, "budget": budget}

    def held(name: str) -> int:
        return int(results[name]["stats"][-1]["resident_bytes"])

    fits = int(1.5 * nbytes(JpegFolder(folder)[0]) * N)
    family = "DataLoader 0w"
    run("DataLoader plain", family, None, dataloader_case, folder, None)
    run("DataLoader preload fits", family, fits, dataloader_case, folder, fits)
    half = held("DataLoader preload fits") // 2
    run("DataLoader preload half", family, half, dataloader_case, folder, half)
    if not OWN.no_workers:
        family = "DataLoader 2w"
        run("DataLoader 2w plain", family, None, dataloader_case, folder, None, 2)
        run("DataLoader 2w preload fits", family, fits, dataloader_case, folder, fits, 2)
        run(
            "DataLoader 2w preload fits threads=0",
            family,
            fits,
            dataloader_case,
            folder,
            fits,
            2,
            0,
        )
    for where, side in (("prep", SIDE), ("fetch", OUT)):
        family = f"Tank {where}-resize"
        fits = int(1.5 * (side * side * 3 + 4096) * N)  # a row plus generous object overhead
        run(f"{family} plain", family, None, tank_case, pack, None, where)
        run(f"{family} fits", family, fits, tank_case, pack, fits, where)
        half = held(f"{family} fits") // 2
        run(f"{family} half", family, half, tank_case, pack, half, where)
    return results


def report(results: dict[str, dict[str, Any]], load_before: tuple, jpeg_kib: float) -> None:
    from rich.console import Console
    from rich.table import Table

    plain = {
        r["family"]: statistics.mean(r["rates"]) for r in results.values() if r["budget"] is None
    }
    table = Table(
        title=(
            f"preload: {N} JPEGs 256->128, batch {BATCH}, torch/OMP/MKL threads {args.threads}, "
            f"preload threads {PRELOAD_THREADS}, preloaded_data {AHEAD}; samples/s"
        )
    )
    columns = ("case", "epoch 1", "epoch 2", "epoch 3", "e2+/plain", "resident MiB",
               "peak MiB", "budget MiB", "hit rate e2+", "data wait s")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "case" else "right")
    verdicts = []
    for name, r in results.items():
        r["ratio_later_over_plain"] = statistics.mean(r["rates"][1:]) / plain[r["family"]]
        r["ratio_epoch1_over_plain"] = r["rates"][0] / plain[r["family"]]
        last = r["stats"][-1]
        cells = [f"{x:.0f}" for x in r["rates"]] + [f"{r['ratio_later_over_plain']:.2f}x"]
        if last is None:
            cells += ["-", "-", "-", "-", "-"]
        else:
            r["later_hit_rate"] = _later_hit_rate(r["stats"])
            assert last["peak_resident_bytes"] <= r["budget"], (name, last, r["budget"])
            cells += [_mib(last["resident_bytes"]), _mib(last["peak_resident_bytes"]),
                      _mib(r["budget"]), f"{r['later_hit_rate']:.2f}",
                      f"{last['data_wait_s']:.2f}"]  # fmt: skip
            target = 5.0 if "fits" in name else 1.0
            ok = r["ratio_later_over_plain"] >= target
            verdicts.append(
                f"{name}: epochs 2+ {r['ratio_later_over_plain']:.2f}x plain "
                f"(target >= {target:g}x{'' if 'fits' in name else ' and peak <= budget'}): "
                f"{'met' if ok else 'MISSED'}; peak {last['peak_resident_bytes']} <= budget "
                f"{r['budget']}"
            )
        table.add_row(name, *cells)
    Console(width=200).print(table)
    for line in verdicts:
        print(line)
    payload = {
        "benchmark": "preload",
        "images": N,
        "image": {"stored": [SIDE, SIDE, 3], "served": [3, OUT, OUT], "jpeg_kib": jpeg_kib},
        "batch": BATCH,
        "epochs": EPOCHS,
        "threads": {
            "torch_num_threads": torch.get_num_threads(),
            "env": {
                k: os.environ.get(k)
                for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "XLA_FLAGS")
            },
            "preload_threads": PRELOAD_THREADS,
            "preloaded_data": AHEAD,
            "dataloader_num_workers": {"DataLoader 0w": 0, "DataLoader 2w": 2},
            "dataloader_start_method": torch.multiprocessing.get_start_method(),
            "tank_workers": 0,
        },
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "pillow": PIL.__version__,
            "dualtrain": dualtrain.__version__,
        },
        "quick": args.quick,
        "cases": results,
    }
    harness._write_atomic(args.json, json.dumps(payload, indent=2, default=str))
    print(f"results written to {args.json}")


if __name__ == "__main__":
    main()
