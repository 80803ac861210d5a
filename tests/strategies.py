"""Hypothesis strategies shared by the test folders: dtypes, shapes, arrays, layouts, pytrees."""

from __future__ import annotations

import collections
import dataclasses

import ml_dtypes
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dualtrain

# Every dtype that crosses between NumPy, torch and JAX.
DTYPES_32 = ("bool", "int8", "int16", "int32", "uint8", "uint16", "uint32",
             "float16", "bfloat16", "float32", "complex64")  # fmt: skip
DTYPES_64 = ("int64", "uint64", "float64", "complex128")
DTYPES = DTYPES_32 + DTYPES_64


def np_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def strategies_sampled(values):
    return st.sampled_from(values)


shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)
nonempty_shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6)


@st.composite
def arrays(draw, dtypes=DTYPES, shape=shapes) -> np.ndarray:
    """A 64-byte aligned, C-contiguous array of any listed dtype, values of any bit pattern."""
    name = draw(st.sampled_from(dtypes))
    dims = draw(shape)
    dtype = np_dtype(name)
    if name == "bfloat16":
        bits = draw(hnp.arrays(np.uint16, dims))
        values = bits.view(dtype)
    elif name == "bool":
        values = draw(hnp.arrays(np.bool_, dims))
    else:
        values = draw(hnp.arrays(dtype, dims))
    out = dualtrain.aligned_empty(values.shape, dtype)
    out[...] = values
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-exact equality (NaN payloads and signed zeros included)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == np.bool_:
        return bool(np.array_equal(a, b))
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.uint64}
    view = width[a.dtype.itemsize]
    return bool(
        np.array_equal(np.ascontiguousarray(a).view(view), np.ascontiguousarray(b).view(view))
    )


LAYOUTS = ("plain", "reversed", "strided", "transposed", "misaligned", "readonly")


@st.composite
def laid_out(draw, dtypes=DTYPES_32) -> tuple[np.ndarray, str]:
    """An array in one of the awkward layouts a converter must handle, and the layout's name."""
    layout = draw(st.sampled_from(LAYOUTS))
    base = draw(arrays(dtypes=dtypes, shape=nonempty_shapes))
    if layout == "reversed":
        return base[::-1], layout
    if layout == "strided":
        return base[::2], layout
    if layout == "transposed":
        return base.T, layout
    if layout == "misaligned":
        raw = dualtrain.aligned_empty(base.nbytes + base.itemsize, base.dtype).reshape(-1)
        out = raw[1 : 1 + base.size].reshape(base.shape)
        out[...] = base
        return out, layout
    if layout == "readonly":
        base.flags.writeable = False
    return base, layout


Pair = collections.namedtuple("Pair", ["left", "right"])


@dataclasses.dataclass(frozen=True)
class Record:
    weights: object
    label: object
    note: str = "kept"


@st.composite
def pytrees(draw, leaves=None, max_leaves: int = 6):
    """Nests of dict, list, tuple, namedtuple and dataclass holding `leaves` and scalars."""
    if leaves is None:
        leaves = st.one_of(arrays(dtypes=DTYPES_32), st.integers(), st.none(), st.text(max_size=3))

    def extend(children):
        return st.one_of(
            st.dictionaries(st.text("abcxyz", min_size=1, max_size=3), children, max_size=3),
            st.lists(children, max_size=3),
            st.tuples(children, children),
            st.builds(Pair, children, children),
            st.builds(Record, children, children),
        )

    return draw(st.recursive(leaves, extend, max_leaves=max_leaves))


# --- dock layers ------------------------------------------------------------------------

LAYER_KINDS = (
    "Dense", "Conv", "ConvTranspose", "MaxPool", "AvgPool", "GlobalAvgPool", "GlobalMaxPool",
    "Reshape", "Flatten", "BatchNorm", "LayerNorm", "Dropout", "Embedding",
)  # fmt: skip


def _divisor(draw, n: int) -> int:
    return draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))


@st.composite
def dock_cases(draw, kind: str):
    """A dock layer of `kind` with drawn hyper-parameters, and a float64 input that fits it."""
    from dualtrain.craft import dock

    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    batch = draw(st.integers(1, 3))

    def data(*shape):
        return rng.normal(size=shape)

    if kind == "Dense":
        i, o = draw(st.integers(1, 6)), draw(st.integers(1, 6))
        lead = draw(st.lists(st.integers(1, 3), min_size=0, max_size=2))
        return dock.Dense(i, o, bias=draw(st.booleans())), data(batch, *lead, i)
    if kind == "Conv":
        nd = draw(st.integers(1, 3))
        groups = draw(st.integers(1, 3))
        cin, cout = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 2))
        k = tuple(draw(st.integers(1, 3)) for _ in range(nd))
        d = tuple(draw(st.integers(1, 2)) for _ in range(nd))
        s = tuple(draw(st.integers(1, 2)) for _ in range(nd))
        padding = draw(st.one_of(
            st.sampled_from(["same", "valid"]), st.integers(0, 2),
            st.tuples(*[st.tuples(st.integers(0, 2), st.integers(0, 2)) for _ in range(nd)]),
        ))  # fmt: skip
        sizes = [
            draw(st.integers(dd * (kk - 1) + 1, dd * (kk - 1) + 4))
            for kk, dd in zip(k, d, strict=True)
        ]
        layer = dock.Conv(cin, cout, k, s, padding, d, groups, bias=draw(st.booleans()))
        return layer, data(batch, cin, *sizes)
    if kind == "ConvTranspose":
        groups = draw(st.integers(1, 2))
        cin, cout = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 2))
        k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        d = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
        p = tuple(draw(st.integers(0, dd * (kk - 1) // 2)) for kk, dd in zip(k, d, strict=True))
        op = tuple(draw(st.integers(0, max(ss, dd) - 1)) for ss, dd in zip(s, d, strict=True))
        layer = dock.ConvTranspose(cin, cout, k, s, p, op, d, groups, bias=draw(st.booleans()))
        return layer, data(batch, cin, draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    if kind in ("MaxPool", "AvgPool"):
        nd = draw(st.integers(1, 3))
        k = tuple(draw(st.integers(1, 3)) for _ in range(nd))
        s = tuple(draw(st.integers(1, 3)) for _ in range(nd))
        p = tuple(draw(st.integers(0, kk // 2)) for kk in k)
        sizes = [draw(st.integers(kk, kk + 4)) for kk in k]
        return getattr(dock, kind)(k, s, p), data(batch, draw(st.integers(1, 3)), *sizes)
    if kind in ("GlobalAvgPool", "GlobalMaxPool"):
        spatial = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
        return getattr(dock, kind)(), data(batch, draw(st.integers(1, 3)), *spatial)
    if kind == "Reshape":
        shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
        return dock.Reshape((batch, -1)), data(batch, *shape)
    if kind == "Flatten":
        shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
        return dock.Flatten(draw(st.integers(1, len(shape)))), data(batch, *shape)
    if kind == "BatchNorm":
        c = draw(st.integers(1, 4))
        spatial = draw(st.lists(st.integers(1, 3), min_size=0, max_size=2))
        layer = dock.BatchNorm(c, momentum=draw(st.floats(0, 1)), affine=draw(st.booleans()))
        return layer, data(batch + 1, c, *spatial)
    if kind == "LayerNorm":
        shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
        return dock.LayerNorm(shape, affine=draw(st.booleans())), data(batch, *shape)
    if kind == "Dropout":
        return dock.Dropout(draw(st.floats(0, 0.9))), data(batch, draw(st.integers(1, 6)))
    if kind == "Embedding":
        n, dim = draw(st.integers(1, 8)), draw(st.integers(1, 4))
        ids = rng.integers(0, n, size=(batch, draw(st.integers(1, 4))))
        return dock.Embedding(n, dim), ids
    raise ValueError(kind)
