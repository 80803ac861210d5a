"""Fuel: Tank against torch's DataLoader and a plain loop over the same pack, same work.

The workload of docs/benchmarks.md: N JPEG images (Pillow-made, 224x224x3, quality 75,
~12 KiB) with int labels in one HDF5 pack; batches of 64; per sample: read the bytes,
decode with Pillow, augment with Comburant(Flip(), Brighten(0.1)) keyed by (seed, epoch,
row). Contenders, each built fresh per round (cold start) and run for one epoch:

- plain loop: one thread, np.stack per batch;
- DataLoader: a Dataset opening the HDF5 file lazily per worker and holding its image
  dataset open (never looked up per row), default_collate, num_workers 0 and 2 (fork,
  torch's default here);
- Tank: to="torch", workers 0 and 2 (threads).

Reported: samples/s, time to first batch, peak memory (PSS of the process and its worker
processes, above what it held before), and the decode roof: one core's decode + augment
rate (bytes already in memory) times the worker count. Also FuelGenerator.generate against
a plain serial Pillow + h5py loop, in images/s. Targets: >= 1.3x DataLoader at equal
workers, >= 85% of the roof, first batch no later than DataLoader's.

    ./dev bench fuel [--threads 1] [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness

args = harness.parse_args("fuel")

import csv  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from dualtrain.fuel import Brighten, Comburant, Flip, FuelGenerator, Tank, decode  # noqa: E402
from dualtrain.fuel.images import encode, prepare  # noqa: E402

harness.set_torch_threads(args.threads)

N = 600 if args.quick else 2000
ROUNDS = 1 if args.quick else 3
BATCH, SEED = 64, 0
AUGMENT = Comburant(Flip(), Brighten(0.1))


def make_raw(folder: str) -> str:
    """N raw 256x256 JPEGs (smooth colour fields with noise) and their CSV list."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:256, 0:256]
    rows = [["image", "label"]]
    for i in range(N):
        planes = [(xx * (i % 7 + 1) + yy * (c + 1) * (i % 3 + 1) + 31 * i) % 256 for c in range(3)]
        pixels = np.clip(np.stack(planes, -1) + rng.normal(0, 6, (256, 256, 3)), 0, 255)
        Image.fromarray(pixels.astype(np.uint8)).save(f"{folder}/{i}.jpg", quality=90)
        rows.append([f"{i}.jpg", str(i % 10)])
    with open(f"{folder}/list.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return f"{folder}/list.csv"


def plain_generate(folder: str, dst: str) -> None:
    """The baseline pack: serial Pillow decode + resize + encode, one h5py write."""
    blobs = []
    for i in range(N):
        with open(f"{folder}/{i}.jpg", "rb") as f:
            img, _ = prepare(f.read(), 224, 224, 3, keep_exif=False)
        blobs.append(np.frombuffer(encode(img, "JPEG", 75), np.uint8))
    with h5py.File(dst, "w") as f:
        f["image"] = np.concatenate(blobs)
        f["image.offsets"] = np.concatenate([[0], np.cumsum([b.size for b in blobs])])
        f["label"] = np.arange(N) % 10


class Pss:
    """Peak proportional set size of this process and its children while running."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()

    @staticmethod
    def now() -> int:
        pids = [os.getpid()]
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids += [int(p) for p in f.read().split()]
        total = 0
        for pid in pids:
            try:
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    total += next(int(ln.split()[1]) for ln in f if ln.startswith("Pss:")) * 1024
            except (FileNotFoundError, ProcessLookupError, StopIteration):
                pass
        return total

    def _watch(self) -> None:
        # 4 Hz: reading smaps_rollup walks every mapping (ms in a torch + JAX process), and
        # a faster sampler steals the cores the contenders are measured on.
        while not self._stop.wait(0.25):
            self.peak = max(self.peak, self.now())

    def __enter__(self) -> Pss:
        self.start = self.now()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def sample_work(
    images: h5py.Dataset, labels: np.ndarray, offsets: np.ndarray, epoch: int, i: int
) -> tuple[np.ndarray, int]:
    """Read + decode + augment one row, the way every contender does it."""
    image = decode(images[offsets[i] : offsets[i + 1]])
    return AUGMENT(image, key=(SEED, epoch, i)), int(labels[i])


class H5Images(torch.utils.data.Dataset):
    """The DataLoader's dataset: the HDF5 file opened lazily, once per worker, its image
    dataset held open (never looked up per row) and its offsets and labels read whole."""

    def __init__(self, path: str) -> None:
        self.path, self.images, self.labels, self.offsets = path, None, None, None
        self.epoch = 0

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        if self.images is None:
            f = h5py.File(self.path, "r")
            self.images, self.labels = f["image"], f["label"][()]
            self.offsets = f["image.offsets"][()]
        return sample_work(self.images, self.labels, self.offsets, self.epoch, i)


def run_plain(path: str) -> tuple[float, int]:
    start = time.perf_counter()
    first = None
    with h5py.File(path, "r") as f:
        images, labels, offsets = f["image"], f["label"][()], f["image.offsets"][()]
        order = np.random.default_rng(SEED).permutation(N)
        for b in range(0, N, BATCH):
            rows = [sample_work(images, labels, offsets, 0, int(i)) for i in order[b : b + BATCH]]
            np.stack([r[0] for r in rows])
            first = first or time.perf_counter() - start
    return first, N


def run_loader(path: str, workers: int) -> tuple[float, int]:
    start = time.perf_counter()
    loader = torch.utils.data.DataLoader(
        H5Images(path), batch_size=BATCH, shuffle=True, num_workers=workers
    )
    first, count = None, 0
    for images, _ in loader:
        count += len(images)
        first = first or time.perf_counter() - start
    return first, count


def run_tank(path: str, workers: int) -> tuple[float, int]:
    start = time.perf_counter()
    prep = lambda s: {**s, "image": AUGMENT(s["image"])}  # noqa: E731
    spec = {"image": "uint8", "label": "int64"}
    first, count = None, 0
    with Tank(path, spec, BATCH, prep_fn=prep, to="torch", workers=workers, seed=SEED) as tank:
        for batch in tank:
            count += len(batch["image"])
            first = first or time.perf_counter() - start
    return first, count


def core_rate(path: str) -> float:
    """One core's decode + augment rate, samples/s, on bytes already in memory."""
    with h5py.File(path, "r") as f:
        offsets = f["image.offsets"][()]
        blobs = [f["image"][offsets[i] : offsets[i + 1]] for i in range(min(N, 400))]
    start = time.perf_counter()
    for i, blob in enumerate(blobs):
        AUGMENT(decode(blob), key=(SEED, 0, i))
    return len(blobs) / (time.perf_counter() - start)


def measure(fn, *a) -> dict[str, float]:
    with Pss() as pss:
        start = time.perf_counter()
        first, count = fn(*a)
        seconds = time.perf_counter() - start
    return {"rate": count / seconds, "first": first, "pss": (pss.peak - pss.start) / 2**20}


def main() -> None:
    tmp = tempfile.mkdtemp(prefix="dualtrain-bench-fuel-")
    listing = make_raw(tmp)
    print(f"{N} raw JPEGs made in {tmp}")
    gen = FuelGenerator(file_dir=tmp, file_list=listing, dtype=["vuint8", "int64"])
    pack = f"{tmp}/pack.h5"
    gen_times, plain_times = [], []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        plain_generate(tmp, f"{tmp}/plain.h5")
        plain_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        gen.generate(pack, 224, 224, quality=75, keep_exif=False, workers=2)
        gen_times.append(time.perf_counter() - start)
    mean_kib = os.path.getsize(pack) / N / 1024
    contenders = {
        "plain loop": lambda: measure(run_plain, pack),
        "DataLoader 0w": lambda: measure(run_loader, pack, 0),
        "Tank 0w": lambda: measure(run_tank, pack, 0),
        "DataLoader 2w": lambda: measure(run_loader, pack, 2),
        "Tank 2w": lambda: measure(run_tank, pack, 2),
    }
    results: dict[str, list[dict[str, float]]] = {k: [] for k in contenders}
    cores = []
    for _ in range(ROUNDS):  # alternate, so machine noise falls on every contender alike
        cores.append(core_rate(pack))
        for name, run in contenders.items():
            results[name].append(run())
    core = statistics.median(cores)
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in results.items()}
    rows = [_row("generate, workers 2", "serial Pillow + h5py", plain_times, gen_times, N)]
    for w in (0, 2):
        base, ours = med[f"DataLoader {w}w"], med[f"Tank {w}w"]
        rows.append(_rate_row(f"Tank {w} workers", f"DataLoader {w} workers", base, ours,
                              roof=core * max(w, 1)))  # fmt: skip
    rows.append(_rate_row("Tank 0 workers", "plain loop", med["plain loop"], med["Tank 0w"],
                          roof=core))  # fmt: skip
    harness.report("fuel", rows, args, images=N, batch=BATCH, image_kib=round(mean_kib, 1),
                   core_rate=round(core, 1), medians=med)  # fmt: skip


def _timing(seconds: list[float]) -> harness.Timing:
    return harness.Timing(statistics.median(seconds), min(seconds), max(seconds), len(seconds))


def _row(case: str, baseline: str, base_s: list[float], ours_s: list[float], n: int):
    extra = {"ours img/s": f"{n / statistics.median(ours_s):.0f}",
             "base img/s": f"{n / statistics.median(base_s):.0f}"}  # fmt: skip
    return harness.Row(case, baseline, _timing(base_s), _timing(ours_s), extra)


def _rate_row(case: str, baseline: str, base: dict, ours: dict, roof: float):
    # Timings are seconds per sample, so the ratio reads as a speed-up.
    extra = {
        "ours samples/s": f"{ours['rate']:.0f}",
        "base samples/s": f"{base['rate']:.0f}",
        "of roof": f"{ours['rate'] / roof:.0%}",
        "first batch ours/base": f"{ours['first'] * 1e3:.0f}/{base['first'] * 1e3:.0f} ms",
        "peak MiB ours/base": f"{ours['pss']:.0f}/{base['pss']:.0f}",
    }
    one = lambda r: harness.Timing(1 / r["rate"], 1 / r["rate"], 1 / r["rate"], ROUNDS)  # noqa: E731
    return harness.Row(case, baseline, one(base), one(ours), extra)


if __name__ == "__main__":
    main()
