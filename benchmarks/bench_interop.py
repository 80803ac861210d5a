"""convert() against each framework's own zero-copy call, per pair, 1/8/64 tensors.

Cases: 4 KiB and 64 MiB float32 tensors, converted as a list of 1, 8 or 64 between each pair
of NumPy, torch and JAX. The baseline is the framework's own call on each tensor in a loop
(torch.from_numpy, Tensor.numpy, jnp.from_dlpack, np.asarray, torch.from_dlpack). Reported:
the ratio, our overhead per tensor in µs (target <= 2), and the bytes we copied (target: 0
on every zero-copy path). JAX -> torch is measured with copy=False, its zero-copy contract;
under the default copy=None torch gets a copy because it cannot mark memory read-only.

A second table times the paths that must copy, against the plain way of getting the same
result: JAX -> torch under copy=None (vs torch.from_dlpack(...).clone()), a NumPy array
from NumPy's own allocator into JAX (vs jnp.asarray, which always copies), and float64 into
JAX without x64 (vs jnp.asarray, which narrows silently).

    ./dev bench interop [--threads 1] [--quick] [--json PATH]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness

args = harness.parse_args("interop")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import dualtrain  # noqa: E402

harness.set_torch_threads(args.threads)

SIZES = {"4 KiB": 1024, "64 MiB": 16 * 1024 * 1024}  # float32 elements
COUNTS = (1, 8, 64)

BASELINES = {
    ("numpy", "torch"): ("torch.from_numpy", torch.from_numpy),
    ("numpy", "jax"): ("jnp.from_dlpack", jnp.from_dlpack),
    ("torch", "numpy"): ("Tensor.numpy", lambda t: t.numpy()),
    ("torch", "jax"): ("jnp.from_dlpack", jnp.from_dlpack),
    ("jax", "numpy"): ("np.asarray", np.asarray),
    ("jax", "torch"): ("torch.from_dlpack", torch.from_dlpack),
}


def make_sources(elements: int, count: int) -> dict[str, list]:
    # dualtrain's aligned buffers: NumPy's own large arrays would make JAX copy.
    arrays = [dualtrain.aligned_empty(elements, np.float32) for _ in range(count)]
    for i, a in enumerate(arrays):
        a.fill(i)
    return {
        "numpy": arrays,
        "torch": [torch.from_numpy(a) for a in arrays],
        "jax": [jnp.from_dlpack(a) for a in arrays],
    }


def main() -> None:
    rows = []
    for size_name, elements in SIZES.items():
        for count in COUNTS:
            sources = make_sources(elements, count)
            for (src, dst), (base_name, base_fn) in BASELINES.items():
                xs = sources[src]
                copy = False if (src, dst) == ("jax", "torch") else None
                with dualtrain.count_copies() as copies:
                    dualtrain.convert(xs, to=dst, copy=copy)
                row = harness.compare(
                    f"{src} -> {dst}, {count} x {size_name}",
                    baseline=lambda xs=xs, f=base_fn: [f(x) for x in xs],
                    ours=lambda xs=xs, dst=dst, copy=copy: dualtrain.convert(xs, to=dst, copy=copy),
                    baseline_name=base_name,
                    quick=args.quick,
                )
                row.extra["µs over baseline per tensor"] = round(
                    (row.ours.median - row.base.median) / count * 1e6, 2
                )
                row.extra["bytes copied"] = copies.nbytes
                rows.append(row)
            del sources
    rows += copying_rows()
    over = [
        r.extra["µs over baseline per tensor"]
        for r in rows
        if "µs over baseline per tensor" in r.extra
    ]
    harness.report(
        "interop",
        rows,
        args,
        torch=torch.__version__,
        jax=jax.__version__,
        numpy=np.__version__,
        max_overhead_us_per_tensor=max(over),
        median_overhead_us_per_tensor=float(np.median(over)),
        bytes_copied_total=sum(r.extra["bytes copied"] for r in rows),
    )


def unaligned(elements: int) -> np.ndarray:
    """float32 values that start off a 64-byte boundary, as NumPy's own arrays usually do."""
    raw = np.arange(elements + 16, dtype=np.float32)
    start = next(k for k in range(16) if raw[k:].ctypes.data % 64)
    return raw[start : start + elements]


def copying_rows() -> list:
    rows = []
    for size_name, elements in SIZES.items():
        host = unaligned(elements)
        wide = np.arange(elements, dtype=np.float64)
        j = jnp.asarray(host)
        cases = [
            ("jax -> torch (copy=None)", "from_dlpack().clone()",
             lambda j=j: torch.from_dlpack(j).clone(),
             lambda j=j: dualtrain.convert(j, to="torch")),
            ("numpy (unaligned) -> jax", "jnp.asarray",
             lambda h=host: jnp.asarray(h), lambda h=host: dualtrain.convert(h, to="jax")),
            ("float64 numpy -> jax (narrowed)", "jnp.asarray",
             lambda w=wide: jnp.asarray(w),
             lambda w=wide: dualtrain.convert(w, to="jax", narrow="allow")),
        ]  # fmt: skip
        for case, base_name, base_fn, ours_fn in cases:
            with dualtrain.count_copies() as copies:
                ours_fn()
            row = harness.compare(
                f"{case}, 1 x {size_name}",
                baseline=lambda f=base_fn: jax.block_until_ready(f()),
                ours=lambda f=ours_fn: jax.block_until_ready(f()),
                baseline_name=base_name,
                quick=args.quick,
            )
            row.extra["bytes copied"] = copies.nbytes
            rows.append(row)
    return rows


if __name__ == "__main__":
    main()
