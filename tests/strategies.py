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
