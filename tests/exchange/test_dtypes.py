"""dualtrain.dtypes: the one dtype-name table, and the places that read it."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

from dualtrain import dtypes, layout, validate
from dualtrain.checkpoint import anchor_file

ROWS = st.sampled_from(dtypes.TABLE)


@given(ROWS)
def test_name_dtype_name_round_trips(row):
    assert dtypes.numpy_dtype(row.name) == row.dtype
    assert dtypes.name_of(row.dtype) == row.name
    assert dtypes.name_of(row.dtype.type) == row.name
    assert dtypes.BY_NAME[row.name] is row
    assert row.itemsize == row.dtype.itemsize


@given(ROWS, st.sampled_from(["<", ">", "="]))
def test_safetensors_code_round_trips_in_any_byte_order(row, order):
    code = dtypes.code_of(row.dtype.newbyteorder(order))
    assert code == row.code
    if code is not None:
        assert dtypes.BY_CODE[code] == row.dtype


def test_the_table_is_whole_and_without_duplicates():
    names = [row.name for row in dtypes.TABLE]
    codes = [row.code for row in dtypes.TABLE if row.code is not None]
    assert len(set(names)) == len(names) and len(set(codes)) == len(codes)
    assert {row.dtype for row in dtypes.TABLE} == {dtypes.numpy_dtype(n) for n in names}
    assert dtypes.numpy_dtype("bfloat16") == np.dtype(ml_dtypes.bfloat16)
    assert dtypes.numpy_dtype("<f4") == np.dtype(np.float32)  # NumPy's own spellings still
    assert dtypes.name_of("f4") == "float32" and dtypes.name_of("torch.bfloat16") == "bfloat16"
    with pytest.raises(TypeError):
        dtypes.numpy_dtype("float7")


@given(ROWS)
def test_kinds_group_the_casts_allowed(row):
    got = dtypes.kind(row.dtype)
    expected = {"uint": "int", "complex": row.name}.get(row.kind, row.kind)
    assert got == expected
    assert row.kind != "float" or np.dtype(row.dtype).itemsize in (1, 2, 4, 8)


def test_named_sets():
    assert dtypes.FLOAT_NAMES == ("float16", "bfloat16", "float32", "float64")
    assert "float8_e4m3fn" not in dtypes.CARRIED_NAMES and "complex64" in dtypes.CARRIED_NAMES
    assert dtypes.CARRIED_NAMES - {"complex64", "complex128"} == dtypes.STORED_NAMES
    for name in dtypes.CARRIED_NAMES:
        assert dtypes.kind(dtypes.numpy_dtype(name)) in ("bool", "int", "float", name)


def test_the_old_tables_are_the_table():
    """The tables that lived in layout, validate and the anchor file now read this one."""
    assert layout.CARRIED_NAMES is dtypes.CARRIED_NAMES
    assert frozenset(dtypes.numpy_dtype(n) for n in dtypes.CARRIED_NAMES) == layout.CARRIED
    assert validate.FLOAT_DTYPES is dtypes.FLOAT_NAMES
    assert anchor_file._DTYPES is dtypes.BY_CODE
    assert validate.check_float_dtype("dtype", "bfloat16") == np.dtype(ml_dtypes.bfloat16)


def test_torch_and_jax_dtypes_are_named_like_numpys():
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    for name in dtypes.CARRIED_NAMES:
        assert dtypes.name_of(getattr(torch, name)) == name
        assert dtypes.name_of(jnp.dtype(name)) == name
