"""SpeedTorch's API on the EmbeddingStore, for code migrating from SpeedTorch.

``from dualtrain_torch.compat import speedtorch as SpeedTorch`` and SpeedTorch's code runs:
a small ``nn.Embedding`` in the model, a ``ModelFactory`` and an ``OptimizerFactory`` that
swap the batch's rows (and their optimizer state) in before the forward pass and back after
``optimizer.step()``. The layout is SpeedTorch's (one row per id occurrence; the local ids
of ``variableTransformer`` are NumPy ``arange`` arrays), and unlike SpeedTorch repeated ids
are right: see `dualtrain_torch.compat.speedtorch_rows`. The result equals
``dualtrain_torch.attach(..., mode="lazy")``.

Every class of SpeedTorch's package is here under its name, taking SpeedTorch's arguments
in SpeedTorch's order with SpeedTorch's defaults: the CuPy classes (``ModelFactory``,
``OptimizerFactory``, ``DataGadget``, ``COM``), the torch ones (``PytorchModelFactory``,
``GPUPytorch...``, ``CPUPytorch...``, ``...COM``) and the memmap ones (``...MM``). The
factories are all `ModelFactory` / `OptimizerFactory` underneath; they differ only in their
arguments. One default differs: ``deviceType=None`` means "cuda" when CUDA is present, else
"cpu" (SpeedTorch's "cuda" cannot run without a GPU; "cuda" given on a machine without one
is refused, naming the argument). The tables live in host memory, pinned when CUDA is
present, whatever ``CPUPinn`` or ``pinType`` say (both are checked to be bools). Arguments
dualtrain adds (``deviceType`` on the classes SpeedTorch gave none, ``seed`` on the init
methods) are keyword-only, so no positional call means something else than in SpeedTorch.
SpeedTorch's CuPy allocator (``PMemory``, ``my_pinned_allocator`` and their ``MM`` twins)
is not provided: importing it raises `RetiredError` saying why.

Optimizers: those with a row-wise form (`dualtrain_torch.embeddings_optimizers.SUPPORTED`:
SGD, Adam, AdamW, Adamax, NAdam, RAdam, Adagrad, RMSprop, Adadelta, Rprop, ASGD,
SparseAdam); others are refused with the reason.

Files are SpeedTorch's: ``saveCupy``/``loadCupy`` write and read NumPy's ``.npy`` format (what
``cupy.save`` writes; CuPy itself is not needed), ``saveTorch``/``loadTorch`` a ``torch.save``
file at exactly the name given, read back with ``weights_only=True`` (no code in the file
runs). Every save writes a temporary file and renames it; every load checks shape and dtype
before changing the table.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from typing import Any, cast

import numpy as np
import torch

from dualtrain.compat.retired import retire
from dualtrain.embeddings import EmbeddingStore
from dualtrain.errors import bad_argument
from dualtrain.interop import convert
from dualtrain_torch.compat.speedtorch_com import (
    COM,
    COMMM,
    CPUPytorchCOM,
    GPUPytorchCOM,
    PytorchCOM,
)
from dualtrain_torch.compat.speedtorch_files import (
    checked,
    load_npy,
    load_tensors,
    save_npy,
    save_tensors,
)
from dualtrain_torch.compat.speedtorch_gadget import DataGadget, DataGadgetMM
from dualtrain_torch.compat.speedtorch_rows import (
    Swapped,
    adopt_memmap,
    check_flag,
    check_shape,
    dtype_name,
    fill_like_torch,
    fill_seeded,
    free_name,
    occurrence_rows,
    sum_repeats,
    transfer_for,
    transfer_to,
)
from dualtrain_torch.embeddings_optimizers import (
    FROM_FIRST_GRAD,
    check_row_wise,
    initial_globals,
    probe_state,
)

__all__ = [
    "COM",
    "COMMM",
    "CPUPytorchCOM",
    "CPUPytorchModelFactory",
    "CPUPytorchOptimizerFactory",
    "DataGadget",
    "DataGadgetMM",
    "GPUPytorchCOM",
    "GPUPytorchModelFactory",
    "GPUPytorchOptimizerFactory",
    "ModelFactory",
    "ModelFactoryMM",
    "OptimizerFactory",
    "OptimizerFactoryMM",
    "PytorchCOM",
    "PytorchModelFactory",
    "PytorchOptimizerFactory",
]

_ALLOCATOR = (
    "it was SpeedTorch's CuPy allocator of pinned host memory; no CuPy is needed here: the "
    "tables are pinned when CUDA is present (dualtrain.EmbeddingStore(..., pinned=True) asks "
    "for it), and rows reach the GPU through dualtrain_torch.transfer.Transfer"
)
_RETIRED = {
    "PMemory": _ALLOCATOR,
    "my_pinned_allocator": _ALLOCATOR,
    "PMemoryMM": _ALLOCATOR,
    "my_pinned_allocatorMM": _ALLOCATOR,
}


def __getattr__(name: str) -> Any:
    retire(__name__, name, _RETIRED)


def _ids(pos: Any, neg: Any) -> tuple[Any, ...]:
    return (pos,) if neg is None else (pos, neg)


# id(weight) -> (the weight, weakly; its factory's hook handle). Tensors compare elementwise,
# so they cannot be the keys of a WeakKeyDictionary.
_HOOKS: dict[int, tuple[weakref.ref[torch.Tensor], Any]] = {}


def _sum_repeats_of(factory: weakref.ref[Any], grad: torch.Tensor) -> torch.Tensor:
    made = factory()
    return grad if made is None else made.sum_repeats(grad)


class ModelFactory:
    """The rows of a big embedding, swapped into a small ``nn.Embedding`` per batch.

    SpeedTorch's CuPy class: ``ModelFactory(model_variable, total_classes, embed_dimension,
    datatype='float32', CPUPinn=False)``. The other model factories are this class with
    their own arguments.

    Args:
        model_variable: the model's small ``nn.Embedding`` (its ``weight`` is swapped).
        total_classes: rows of the big table.
        embed_dimension: values per row.
        datatype: NumPy dtype name or torch dtype of the table (a float dtype).
        CPUPinn: a bool, accepted for SpeedTorch compatibility; the table is pinned when
            CUDA is present either way.
        deviceType: (keyword-only, dualtrain's) where the swapped rows live; None: "cuda"
            when present, else "cpu".

    Attributes:
        store: the `dualtrain.EmbeddingStore` holding the table.
    """

    def __init__(
        self,
        model_variable: torch.nn.Module,
        total_classes: int,
        embed_dimension: int,
        datatype: Any = "float32",
        CPUPinn: bool = False,
        *,
        deviceType: str | None = None,
    ) -> None:
        self._build(model_variable, total_classes, embed_dimension, datatype, deviceType)
        self.CPUPinn = check_flag("CPUPinn", CPUPinn)

    def _build(
        self,
        model_variable: torch.nn.Module,
        total_classes: int,
        embed_dimension: int,
        datatype: Any,
        device_type: Any,
        device_name: str = "deviceType",
    ) -> None:
        """What every model factory does with its arguments (checked by SpeedTorch's names)."""
        weight = getattr(model_variable, "weight", None)
        if not isinstance(weight, torch.nn.Parameter):
            raise bad_argument(
                "model_variable",
                type(model_variable).__name__,
                "an nn.Embedding (a module with a weight)",
            )
        self.total_classes, self.embed_dimension = check_shape(total_classes, embed_dimension)
        dtype = dtype_name("datatype", datatype)
        self.transfer = transfer_for(device_name, device_type)
        self.model_variable = model_variable
        self.store = EmbeddingStore(self.total_classes, self.embed_dimension, dtype, "zeros")
        self.device = self.transfer.device
        self._batch = Swapped()
        self._inverse: torch.Tensor | None = None
        # One factory a weight: a new factory on the same embedding takes its hook over
        # (an old factory's hook would sum the new batch's gradients by its own last batch).
        # The hook holds the factory weakly, so the model does not keep an old table alive.
        old = _HOOKS.pop(id(weight), None)
        if old is not None and old[0]() is weight:
            old[1].remove()
        _HOOKS[id(weight)] = (
            weakref.ref(weight),
            weight.register_hook(functools.partial(_sum_repeats_of, weakref.ref(self))),
        )

    def _table_for_init(self) -> None:
        """Called before every init method fills the table (the memmap class makes its file)."""

    # ---- initialization --------------------------------------------------------------

    def zerosInit(self) -> None:
        """Fills the table with zeros."""
        self._table_for_init()
        self.store.initialize("zeros")

    def uniformDistributionInit(self, low: float, high: float, *, seed: int | None = None) -> None:
        """Fills the table from U(low, high).

        Args:
            low: the lower bound.
            high: the upper bound.
            seed: None draws as SpeedTorch's torch factories did (``torch.nn.init.uniform_``
                on the table: ``torch.manual_seed`` reproduces it, and a CPU run gives
                SpeedTorch's numbers); an int fills row by row from (seed, row), exactly as
                ``EmbeddingStore(..., seed=seed)`` does (keyword-only: dualtrain's).
        """
        self._table_for_init()
        if seed is None:
            fill_like_torch(self.store, torch.nn.init.uniform_, a=low, b=high)
            return
        dim = self.store.dim
        fill_seeded(self.store, lambda rows, rng: rng.uniform(low, high, (len(rows), dim)), seed)

    def normalDistributionInit(
        self, mean: float, stdDev: float, *, seed: int | None = None
    ) -> None:
        """Fills the table from N(mean, stdDev^2); `seed` as for `uniformDistributionInit`.

        With ``mean=0`` and a seed, the table equals ``EmbeddingStore(..., init="normal",
        std=stdDev, seed=seed)``.
        """
        self._table_for_init()
        if seed is None:
            fill_like_torch(self.store, torch.nn.init.normal_, mean=mean, std=stdDev)
            return
        dim = self.store.dim
        fill_seeded(self.store, lambda rows, rng: rng.normal(mean, stdDev, (len(rows), dim)), seed)

    def customInit(self, initFunction: Any, *args: Any) -> None:
        """``initFunction(table, *args)`` fills the whole table in place, as torch.nn.init does.

        The table keeps its own shape, so fan-in and fan-out are its own.
        """
        if not callable(initFunction):
            raise bad_argument("initFunction", initFunction, "a function filling a tensor in place")
        self._table_for_init()
        fill_like_torch(self.store, initFunction, *args)

    # ---- the swap --------------------------------------------------------------------

    def variableTransformer(
        self,
        batchSize: int,
        posPerBatch: int,
        negPerBatch: int | None = None,
    ) -> Any:
        """The local ids the model's forward pass takes: NumPy ``arange`` arrays, as SpeedTorch.

        [batchSize, posPerBatch], and [batchSize, negPerBatch] after them when asked.
        """
        pos = np.arange(batchSize * posPerBatch).reshape(batchSize, posPerBatch)
        if negPerBatch is None:
            return pos
        start = batchSize * posPerBatch
        return pos, np.arange(start, start + batchSize * negPerBatch).reshape(
            batchSize, negPerBatch
        )

    def beforeForwardPass(self, retrievedPosIndexes: Any, retrievedNegIndexes: Any = None) -> None:
        """Swaps in the row of every id (positives, then negatives): local row k is id k's."""
        ids = _ids(retrievedPosIndexes, retrievedNegIndexes)
        found = self._batch.begin(ids, self.store.num_rows)
        rows = occurrence_rows(self.store.table, found)
        weight = cast(torch.nn.Parameter, self.model_variable.weight)
        weight.data = self.transfer(rows)
        self._inverse = self.transfer(found.inverse)

    def sum_repeats(self, grad: torch.Tensor) -> torch.Tensor:
        """The swapped batch's gradient with the rows of repeated ids summed (one per id)."""
        found, inverse = self._batch.found, self._inverse
        if found is None or inverse is None or grad.shape[0] != found.inverse.size:
            return grad  # not a swapped batch: the embedding is used as it is
        return sum_repeats(grad, inverse.to(grad.device), found.unique.size)

    def afterOptimizerStep(self, retrievedPosIndexes: Any, retrievedNegIndexes: Any = None) -> None:
        """Writes the batch's updated rows back to the table (one copy per id)."""
        ids = _ids(retrievedPosIndexes, retrievedNegIndexes)
        found = self._batch.same(ids, self.store.num_rows)
        weight = cast(torch.Tensor, self.model_variable.weight).data
        first = torch.from_numpy(self._batch.first).to(weight.device)
        self.store.table[found.unique] = weight.index_select(0, first).cpu().numpy()

    # ---- the table -------------------------------------------------------------------

    def getNumpyVersion(self) -> np.ndarray:
        """The table as a NumPy array (the live table, as SpeedTorch's CPU torch factory).

        Like ``store.table``: every step already returned is in it; later ones change it.
        """
        return self.store.table

    def getCupyVar(self) -> np.ndarray:
        """The table (SpeedTorch's CuPy array; here the live NumPy table, as getNumpyVersion)."""
        return self.store.table

    def getTorchVar(self) -> torch.Tensor:
        """The table as a CPU tensor sharing its memory (SpeedTorch's raised AttributeError)."""
        return cast(torch.Tensor, convert(self.store.table, to="torch"))

    def saveCupy(self, saveFileName: str) -> None:
        """Saves the table as ``cupy.save`` does: a .npy file (``.npy`` appended if missing).

        CuPy is not needed: the file is NumPy's format, which ``cupy.load`` reads too.
        """
        with self.store.held():  # an attachment of the store steps nothing meanwhile
            save_npy(saveFileName, self.store.table)

    def loadCupy(self, loadFileName: str) -> None:
        """Loads a .npy table (from saveCupy or ``cupy.save``) of this table's shape and dtype."""
        loaded = load_npy(loadFileName, "loadFileName")
        with self.store.held():
            self.store.table[...] = checked(self.store.table, loaded, loadFileName, "loadFileName")

    def saveTorch(self, saveFileName: str) -> None:
        """Saves the table as one tensor with ``torch.save``, to exactly `saveFileName`."""
        with self.store.held():
            save_tensors(saveFileName, convert(self.store.table, to="torch"))

    def loadTorch(self, loadFileName: str) -> None:
        """Loads a tensor saved by saveTorch or by SpeedTorch (``torch.save``), on any device.

        The file is read with ``torch.load(weights_only=True)``: no code in it runs (SpeedTorch
        called plain ``torch.load``, which unpickles anything).
        """
        loaded = load_tensors(loadFileName, "loadFileName")
        with self.store.held():
            self.store.table[...] = checked(self.store.table, loaded, loadFileName, "loadFileName")


class OptimizerFactory:
    """The optimizer state of the big embedding, swapped in per batch like its rows.

    SpeedTorch's CuPy class: ``OptimizerFactory(given_optimizer, total_classes,
    embed_dimension, model, variable_name, dtype='float32', CPUPinn=False)``. The other
    optimizer factories are this class with their own arguments.

    Args:
        given_optimizer: the torch optimizer over the model; its class must have a row-wise
            form (SGD, Adam, AdamW, Adamax, NAdam, RAdam, Adagrad, RMSprop, Adadelta, Rprop,
            ASGD, SparseAdam, or a subclass); others are refused with the reason.
        total_classes, embed_dimension: the big table's shape.
        model: the model holding the small embedding.
        variable_name: the embedding's name in ``model.named_parameters()`` (with or
            without ``.weight``).
        dtype: the state tables' float dtype (a NumPy name or a torch dtype).
        CPUPinn: a bool, accepted for SpeedTorch compatibility (pinned when CUDA is present).
        deviceType: (keyword-only, dualtrain's) checked like the model factories'; the
            state's rows go where the parameter is, whatever it says.

    Attributes:
        tables: one full state table per slot (``exp_avg``, ``sum``, ...), by name.
    """

    def __init__(
        self,
        given_optimizer: torch.optim.Optimizer,
        total_classes: int,
        embed_dimension: int,
        model: torch.nn.Module,
        variable_name: str,
        dtype: Any = "float32",
        CPUPinn: bool = False,
        *,
        deviceType: str | None = None,
    ) -> None:
        self._build(given_optimizer, total_classes, embed_dimension, model, variable_name, dtype)
        self.CPUPinn = check_flag("CPUPinn", CPUPinn)
        transfer_for("deviceType", deviceType)  # checked; the state follows the parameter

    def _build(
        self,
        given_optimizer: torch.optim.Optimizer,
        total_classes: int,
        embed_dimension: int,
        model: torch.nn.Module,
        variable_name: str,
        dtype: Any,
    ) -> None:
        """What every optimizer factory does with its arguments (checked by SpeedTorch's names)."""
        if not isinstance(given_optimizer, torch.optim.Optimizer):
            raise bad_argument("given_optimizer", given_optimizer, "a torch.optim.Optimizer")
        if not isinstance(model, torch.nn.Module):
            raise bad_argument("model", type(model).__name__, "the torch.nn.Module being trained")
        cls = check_row_wise(type(given_optimizer), "given_optimizer")
        self.total_classes, self.embed_dimension = check_shape(total_classes, embed_dimension)
        name_of_dtype = dtype_name("dtype", dtype)
        params = dict(model.named_parameters())
        name = variable_name if variable_name in params else f"{variable_name}.weight"
        if name not in params:
            raise bad_argument("variable_name", variable_name, f"one of {sorted(params)}")
        self.optimizer, self.param = given_optimizer, params[name]
        self.variable_name = variable_name
        group = next(
            (g for g in given_optimizer.param_groups if any(p is self.param for p in g["params"])),
            None,
        )
        if group is None:
            raise bad_argument("given_optimizer", cls.__name__, f"an optimizer over {name}")
        self._group = group
        hyper = {k: v for k, v in group.items() if k not in ("params", "fused", "foreach")}
        hyper = {k: v for k, v in hyper.items() if k in _init_args(cls)}
        dtype_t = getattr(torch, name_of_dtype)
        self._init, self._globals = probe_state(cls, hyper, self.embed_dimension, dtype_t)
        self.store = EmbeddingStore(
            self.total_classes, self.embed_dimension, name_of_dtype, "zeros"
        )
        self.transfer = transfer_to(self.param.device)  # state follows the parameter
        self._batch = Swapped()
        self.tables: dict[str, np.ndarray] = {}
        self._stepped = False  # torch builds SGD's buffer from the first gradient itself
        self.optInit()

    def optInit(self) -> None:
        """(Re)allocates one full state table per slot, at the optimizer's initial value."""
        self.tables, self._stepped = {}, False
        for slot, row in self._init.items():
            table = self.store.empty()
            table[...] = convert(row, to="numpy")
            self.tables[slot] = table

    def _initial_globals(self) -> dict[str, Any]:
        """The scalars torch keeps for the parameter (``step``, ...) as before step 1."""
        on_device = self._group.get("fused") or self._group.get("capturable")
        where = self.param.device if on_device else torch.device("cpu")
        values: dict[str, Any] = {"step": 0}  # SparseAdam counts in a Python int
        if torch.is_tensor(self._globals.get("step")):
            values["step"] = torch.tensor(0.0, device=where)
        for name, value in initial_globals(self._globals, self._group).items():
            values[name] = torch.tensor(value, device=where)
        return {k: v for k, v in values.items() if k in self._globals}

    def beforeForwardPass(self, retrievedPosIndexes: Any, retrievedNegIndexes: Any = None) -> None:
        """Swaps in the state rows of every id, as the ModelFactory swaps the weights."""
        ids = _ids(retrievedPosIndexes, retrievedNegIndexes)
        found = self._batch.begin(ids, self.store.num_rows)
        state = self.optimizer.state[self.param]
        for name, value in self._initial_globals().items():
            state.setdefault(name, value)
        gathered = {}
        for slot, table in self.tables.items():
            if not self._stepped and isinstance(self.optimizer, FROM_FIRST_GRAD.get(slot, ())):
                state.pop(slot, None)  # torch creates it from the first gradient
                continue
            gathered[slot] = occurrence_rows(table, found)
        if self.transfer.device != self.param.device:  # the model moved since
            self.transfer = transfer_to(self.param.device)
        state.update(self.transfer(gathered))

    def afterOptimizerStep(self, retrievedPosIndexes: Any, retrievedNegIndexes: Any = None) -> None:
        """Writes the batch's updated state rows back (one copy per id)."""
        ids = _ids(retrievedPosIndexes, retrievedNegIndexes)
        found = self._batch.same(ids, self.store.num_rows)
        state = self.optimizer.state[self.param]
        self._stepped = True
        first = torch.from_numpy(self._batch.first)
        for slot, table in self.tables.items():
            if slot in state:
                rows = state[slot].detach().index_select(0, first.to(state[slot].device))
                table[found.unique] = rows.cpu().numpy()

    def getNumpyVersion(self, slot: str | None = None) -> np.ndarray:
        """A state table (the first slot's by default)."""
        return self.tables[slot or next(iter(self.tables))]

    def saveTorch(self, saveFileName: str) -> None:
        """Saves the state tables as SpeedTorch does: ``torch.save`` of a list, in slot order."""
        tables = [convert(t, to="torch") for t in self.tables.values()]
        save_tensors(saveFileName, tables)

    def loadTorch(self, loadFileName: str) -> None:
        """Loads the list saveTorch wrote; every table is checked before any is changed.

        Read with ``torch.load(weights_only=True)``: no code in the file runs.
        """
        loaded = load_tensors(loadFileName, "loadFileName")
        if not isinstance(loaded, (list, tuple)) or len(loaded) != len(self.tables):
            raise bad_argument(
                "loadFileName",
                loadFileName,
                f"a list of {len(self.tables)} tensors ({', '.join(self.tables)})",
            )
        tables = list(self.tables.values())
        fitting = [
            checked(table, tensor, loadFileName, "loadFileName")
            for table, tensor in zip(tables, loaded, strict=True)
        ]
        for table, values in zip(tables, fitting, strict=True):
            table[...] = values


def _init_args(cls: Any) -> set[str]:
    return set(inspect.signature(cls.__init__).parameters)


# ---- SpeedTorch's other factories: the same two classes, each with its own arguments ----


class PytorchModelFactory(ModelFactory):
    """SpeedTorch's torch-tensor model factory (``SpeedTorch.GenTorch``).

    Args:
        model_variable, total_classes, embed_dimension: as `ModelFactory`.
        datatype: the table's dtype; default ``torch.float``, as SpeedTorch's.
        deviceType: where the swapped rows live: "cuda", "cpu", ...; None (SpeedTorch's
            default is "cuda"): "cuda" when present, else "cpu".
        pinType: a bool, accepted for SpeedTorch compatibility (pinned when CUDA is present).
    """

    def __init__(
        self,
        model_variable: torch.nn.Module,
        total_classes: int,
        embed_dimension: int,
        datatype: Any = torch.float,
        deviceType: str | None = None,
        pinType: bool = False,
    ) -> None:
        self._build(model_variable, total_classes, embed_dimension, datatype, deviceType)
        self.deviceType = deviceType
        self.pinType = check_flag("pinType", pinType)


class _TensorModelFactory(ModelFactory):
    """SpeedTorch's torch-tensor model factories: four arguments, no device argument."""

    def __init__(
        self,
        model_variable: torch.nn.Module,
        total_classes: int,
        embed_dimension: int,
        datatype: Any = torch.float,
        *,
        deviceType: str | None = None,
    ) -> None:
        self._build(model_variable, total_classes, embed_dimension, datatype, deviceType)


class GPUPytorchModelFactory(_TensorModelFactory):
    """SpeedTorch's CUDA-tensor model factory (``SpeedTorch.GPUTorch``): no device argument.

    The rows go to "cuda" when present, else to "cpu"; ``deviceType=`` (keyword-only,
    dualtrain's) chooses.
    """


class CPUPytorchModelFactory(_TensorModelFactory):
    """SpeedTorch's pinned-CPU-tensor model factory (``SpeedTorch.CPUTorchPinned``).

    The table is in host memory (pinned when CUDA is present); the rows go to "cuda" when
    present, else to "cpu"; ``deviceType=`` (keyword-only, dualtrain's) chooses.
    """


class ModelFactoryMM(ModelFactory):
    """SpeedTorch's memory-mapped model factory (``SpeedTorch.CPUCupyPinned``).

    The first init method (zerosInit, uniformDistributionInit, normalDistributionInit,
    customInit) puts the table in a new ``.npy`` file, ``{diskname}{n}.memmap.cpy.npy`` in
    the working directory with the first free n (SpeedTorch's name), memory-mapped: its
    pages, not a copy in memory, are the table. Later inits refill that file (SpeedTorch
    made a new file at every init).

    Args:
        model_variable, total_classes, embed_dimension: as `ModelFactory`.
        diskname: the file name's stem.
        datatype: the table's dtype (SpeedTorch's files were always float32; here datatype's).
        CPUPinn: a bool, accepted for SpeedTorch compatibility.
        deviceType: (keyword-only, dualtrain's) as `ModelFactory`.

    Attributes:
        fileName: the file holding the table, once an init made it (else None).
    """

    def __init__(
        self,
        model_variable: torch.nn.Module,
        total_classes: int,
        embed_dimension: int,
        diskname: str = "variable",
        datatype: Any = "float32",
        CPUPinn: bool = False,
        *,
        deviceType: str | None = None,
    ) -> None:
        if not isinstance(diskname, str) or not diskname:
            raise bad_argument("diskname", diskname, "a file name stem (a non-empty str)")
        self._build(model_variable, total_classes, embed_dimension, datatype, deviceType)
        self.CPUPinn = check_flag("CPUPinn", CPUPinn)
        self.diskname = diskname
        self.fileName: str | None = None

    def _table_for_init(self) -> None:
        if self.fileName is None:
            path = free_name(self.diskname, ".memmap.cpy.npy")
            adopt_memmap(self.store, path)
            self.fileName = str(path)

    def getCupyMM(self) -> np.ndarray:
        """The memory-mapped table (SpeedTorch's CuPy memmap)."""
        return self.store.table


class PytorchOptimizerFactory(OptimizerFactory):
    """SpeedTorch's torch-tensor optimizer factory (``SpeedTorch.GenTorch``).

    Args:
        given_optimizer, total_classes, embed_dimension, model, variable_name: as
            `OptimizerFactory`.
        dtype: the state tables' dtype; default ``torch.float``, as SpeedTorch's.
        deviceType: checked like `PytorchModelFactory`'s; the state's rows go where the
            parameter is (SpeedTorch put them on deviceType, which had to be the same).
        pinType: a bool, accepted for SpeedTorch compatibility.
    """

    def __init__(
        self,
        given_optimizer: torch.optim.Optimizer,
        total_classes: int,
        embed_dimension: int,
        model: torch.nn.Module,
        variable_name: str,
        dtype: Any = torch.float,
        deviceType: str | None = None,
        pinType: bool = False,
    ) -> None:
        self._build(given_optimizer, total_classes, embed_dimension, model, variable_name, dtype)
        transfer_for("deviceType", deviceType)
        self.deviceType = deviceType
        self.pinType = check_flag("pinType", pinType)


class _TensorOptimizerFactory(OptimizerFactory):
    """SpeedTorch's torch-tensor optimizer factories: six arguments, no device argument."""

    def __init__(
        self,
        given_optimizer: torch.optim.Optimizer,
        total_classes: int,
        embed_dimension: int,
        model: torch.nn.Module,
        variable_name: str,
        dtype: Any = torch.float,
    ) -> None:
        self._build(given_optimizer, total_classes, embed_dimension, model, variable_name, dtype)


class GPUPytorchOptimizerFactory(_TensorOptimizerFactory):
    """SpeedTorch's CUDA-tensor optimizer factory (``SpeedTorch.GPUTorch``): no device."""


class CPUPytorchOptimizerFactory(_TensorOptimizerFactory):
    """SpeedTorch's pinned-CPU-tensor optimizer factory (``SpeedTorch.CPUTorchPinned``)."""


class OptimizerFactoryMM(OptimizerFactory):
    """SpeedTorch's memmap optimizer factory (``SpeedTorch.CPUCupyPinned``), same arguments.

    The state tables live in host memory: SpeedTorch's class took no ``diskname`` yet
    needed one, so its ``optInit`` raised AttributeError; there is no file to name.
    """
