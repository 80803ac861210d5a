"""One input dtype rule for every dock layer: torch == JAX == the NumPy reference.

For each kind in the dock catalogue, each input dtype and each parameter dtype, the three
backends either all run the layer (same output dtype, shape and values) or all refuse it
with the same DtypeError, naming the layer, the input's dtype and what it takes. The rule
is the layer's ``input_dtypes`` (see `dualtrain.craft.checks.check_dtype`).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain.craft import dock, reference_forward
from dualtrain.errors import DtypeError
from tests.craft.cross.test_check_input_laws import One
from tests.strategies import LAYER_KINDS, dock_cases

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy
from dualtrain_jax import craft as jcraft  # noqa: E402
from dualtrain_torch import craft as tcraft  # noqa: E402

FEW = settings(max_examples=max(4, settings().max_examples // 5))
INPUT_DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8", "bool")
PARAM_DTYPES = ("bfloat16", "float32", "float64")
TOLERANCE = {"float16": 2e-2, "bfloat16": 1e-1, "float32": 1e-4, "float64": 1e-9}


def _np_dtype(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _cast(x, name):
    if name == "bool":
        return x > 0
    if name in ("int32", "int64", "uint8"):
        return np.abs(np.round(x * 2)).astype(name)
    return x.astype(_np_dtype(name))


def _torch(layer, x, dtype, train):
    module = tcraft.realize(One(layer), seed=0, dtype=dtype)
    module.train(train)
    t = (
        torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
        if x.dtype.name == "bfloat16"
        else torch.from_numpy(x)
    )
    with torch.no_grad():
        y = module(t)
    return np.asarray(y.float().numpy() if y.dtype is torch.bfloat16 else y.numpy()), str(y.dtype)[
        6:
    ]


def _jax(layer, x, dtype, train):
    module = jcraft.realize(One(layer), seed=0, dtype=dtype)
    y, _ = module.apply(
        module.params, module.state, jnp.asarray(x), train=train, rng=jax.random.key(0)
    )
    return np.asarray(y.astype(jnp.float32) if y.dtype == jnp.bfloat16 else y), str(y.dtype)


def _reference(layer, x, dtype, train):
    craft = One(layer)
    y, _ = reference_forward(craft, craft.init(0, dtype), x, train=train)
    return np.asarray(y.astype(np.float32) if y.dtype.name == "bfloat16" else y), y.dtype.name


def _outcome(run, *args):
    try:
        return run(*args)
    except Exception as exc:  # compared across the three backends
        return type(exc), str(exc)


@pytest.mark.parametrize("kind", LAYER_KINDS)
@FEW
@given(data=st.data())
def test_every_backend_takes_and_refuses_the_same_input_dtypes(kind, data):
    layer, x = data.draw(dock_cases(kind))
    name = data.draw(st.sampled_from(INPUT_DTYPES), label="input dtype")
    params = data.draw(st.sampled_from(PARAM_DTYPES), label="param dtype")
    train = (
        kind != "Dropout" and kind != "BatchNorm" and data.draw(st.booleans())
    )  # random masks, batch stats
    x = x if kind == "Embedding" and name.startswith(("int", "uint")) else _cast(x, name)
    with jax.enable_x64(True):
        outcomes = [_outcome(run, layer, x, params, train) for run in (_torch, _jax, _reference)]
    first = outcomes[0]
    if isinstance(first[0], type):  # refused: the same house error everywhere
        assert issubclass(first[0], DtypeError) or kind == "Embedding", first
        assert outcomes[1] == first and outcomes[2] == first, outcomes
        return
    for other in outcomes[1:]:
        assert not isinstance(other[0], type), (first, other)
        assert other[1] == first[1], (first[1], other[1])  # the same output dtype
        assert other[0].shape == first[0].shape
        if first[0].dtype.kind == "f":
            tol = TOLERANCE.get(first[1], 1e-4)
            np.testing.assert_allclose(other[0], first[0], rtol=tol, atol=tol)
        else:
            np.testing.assert_array_equal(other[0], first[0])


@pytest.mark.parametrize("dtype", ["int32", "float64", "float16", "bfloat16"])
def test_dense_refuses_inputs_off_its_parameter_dtype_under_torch_and_jax(dtype):
    # Torch raised its own RuntimeError; JAX promoted and returned a float32 or float64 result.
    layer = dock.Dense(3, 2)
    x = _cast(np.ones((2, 3)), dtype)
    pattern = f"Dense takes inputs of its parameters' dtype float32; got dtype {dtype}"
    for run in (_torch, _jax, _reference):
        with jax.enable_x64(True), pytest.raises(DtypeError, match=pattern):  # x64: no narrowing
            run(layer, x, "float32", False)


def test_dropout_in_training_takes_floats_only_but_passes_anything_in_evaluation():
    layer = dock.Dropout(0.5)
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    for run in (_torch, _jax, _reference):
        out, dtype = run(layer, x, "float32", False)
        assert dtype == "int32" and np.array_equal(out, x)
        with pytest.raises(DtypeError, match="Dropout takes a floating input"):
            run(layer, x, "float32", True)


def test_torch_autocast_may_feed_float32_float16_or_bfloat16_to_a_layer():
    layer = dock.Dense(3, 2)
    module = tcraft.realize(One(layer), seed=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = module(torch.ones(2, 3, dtype=torch.bfloat16))
    assert y.dtype is torch.bfloat16


def test_torch_autocast_takes_what_it_casts_and_refuses_float64_with_a_house_error():
    # Autocast never casts float64: torch raised "mat1 and mat2 must have the same dtype".
    module = tcraft.realize(One(dock.Dense(3, 2)), seed=0)
    for dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cpu", dtype=dtype):
            for given in (torch.float32, torch.float16, torch.bfloat16):
                assert module(torch.ones(2, 3, dtype=given)).dtype is dtype
            pattern = (
                "Dense takes a float32, float16 or bfloat16 input under torch autocast .*; "
                "got dtype float64: cast the input to float32"
            )
            with pytest.raises(DtypeError, match=pattern):
                module(torch.ones(2, 3, dtype=torch.float64))


AUTOCAST_KINDS = ("Dense", "Conv", "ConvTranspose", "BatchNorm", "LayerNorm")


@pytest.mark.parametrize("kind", AUTOCAST_KINDS)
@FEW
@given(data=st.data())
def test_torch_autocast_runs_or_refuses_with_a_dtype_error_never_a_raw_one(kind, data):
    # Every layer with parameters, every input and parameter dtype, under CPU autocast:
    # it runs, or it raises the house DtypeError naming the layer and dtype.
    layer, x = data.draw(dock_cases(kind))
    name = data.draw(st.sampled_from(INPUT_DTYPES), label="input dtype")
    params = data.draw(st.sampled_from(PARAM_DTYPES), label="param dtype")
    to = data.draw(st.sampled_from((torch.bfloat16, torch.float16)), label="autocast dtype")
    module = tcraft.realize(One(layer), seed=0, dtype=params)
    module.train(data.draw(st.booleans(), label="train"))
    t = torch.from_numpy(_cast(x, "float64" if name == "bfloat16" else name))
    t = t.to(torch.bfloat16) if name == "bfloat16" else t
    with torch.no_grad(), torch.autocast("cpu", dtype=to):
        try:
            module(t)
        except DtypeError as exc:
            assert str(exc).startswith(kind) and f"got dtype {name}" in str(exc), exc
            assert name not in ("float32", "float16", "bfloat16") or params != "float32"
        else:
            bare = not module.state_dict()  # LayerNorm(affine=False) takes any float
            assert name in ("float32", "float16", "bfloat16", params) or (
                bare and name == "float64"
            )


@pytest.fixture
def x64_off():
    # JAX's default configuration; the laws above run with x64 on.
    with jax.enable_x64(False):
        yield


@pytest.mark.parametrize("kind", LAYER_KINDS)
@FEW
@given(data=st.data())
def test_jax_without_x64_takes_numpy_float64_as_the_float32_it_computes(kind, data):
    # JAX canonicalizes float64 to float32 before computing; refusing it (as the check did)
    # broke `net(np.random.randn(3, 4))`. The result equals the float32 one exactly.
    if kind == "Embedding":
        return  # integer ids
    layer, x = data.draw(dock_cases(kind))
    with jax.enable_x64(False):
        module = jcraft.realize(One(layer), seed=0)
        wide = module(x)  # a NumPy float64 array, as given
        narrow = module(x.astype(np.float32))
        applied, _ = module.apply(module.params, module.state, x)
        # NumPy float64 params compute as float32 too.
        params = {k: np.asarray(v, np.float64) for k, v in module.params.items()}
        state = {k: np.asarray(v, np.float64) for k, v in module.state.items()}
        from_wide_params, _ = module.apply(params, state, x.astype(np.float32))
    assert wide.dtype == narrow.dtype == applied.dtype == from_wide_params.dtype
    np.testing.assert_array_equal(np.asarray(wide), np.asarray(narrow))
    np.testing.assert_array_equal(np.asarray(applied), np.asarray(narrow))
    np.testing.assert_array_equal(np.asarray(from_wide_params), np.asarray(narrow))


@pytest.mark.usefixtures("x64_off")
@pytest.mark.parametrize("dtype", ["int64", "int32", "bool", "float16"])
def test_jax_without_x64_still_refuses_what_is_not_the_parameters_dtype(dtype):
    # int64 canonicalizes to int32: still not the float32 of the parameters.
    module = jcraft.realize(One(dock.Dense(3, 2)), seed=0)
    x = _cast(np.ones((2, 3)), dtype)
    shown = "int64 \\(computed as int32\\)" if dtype == "int64" else dtype
    pattern = f"Dense takes inputs of its parameters' dtype float32; got dtype {shown}"
    with pytest.raises(DtypeError, match=pattern):
        module(x)
    with pytest.raises(DtypeError, match=pattern):
        module.apply(module.params, module.state, x)


def test_jax_with_x64_still_refuses_float64_into_float32_parameters():
    module = jcraft.realize(One(dock.Dense(3, 2)), seed=0)
    with jax.enable_x64(True), pytest.raises(DtypeError, match="got dtype float64"):
        module(np.ones((2, 3)))
