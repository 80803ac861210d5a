"""SpeedTorch's API on the EmbeddingStore, for code migrating from SpeedTorch.

The names and call order are SpeedTorch's: a small ``nn.Embedding`` in the model, a
``ModelFactory`` and an ``OptimizerFactory`` that swap the batch's rows (and their optimizer
state) in before the forward pass and back after ``optimizer.step()``. Unlike SpeedTorch,
repeated ids are right: each unique row is swapped in once, and the local ids that
``variableTransformer`` handed out are rewritten in place to point at it, so the gradients
of its occurrences add up and no update is lost. The CuPy-named classes (``ModelFactory``,
``OptimizerFactory``) and the torch-named ones (``PytorchModelFactory``, ...) are the same
classes here; pinned memory is used when CUDA is present.

Files are SpeedTorch's: ``saveCupy``/``loadCupy`` write and read NumPy's ``.npy`` format (what
``cupy.save`` writes; CuPy itself is not needed), ``saveTorch``/``loadTorch`` a ``torch.save``
file at exactly the name given, read back with ``weights_only=True``. Every save writes a
temporary file and renames it; every load checks shape and dtype before changing the table.
"""

from __future__ import annotations

import inspect
from typing import Any, cast

import numpy as np
import torch

from dualtrain.embeddings import EmbeddingStore, Lookup, as_ids, lookup
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.interop import convert
from dualtrain_torch.compat.speedtorch_files import (
    checked,
    load_npy,
    load_tensors,
    save_npy,
    save_tensors,
)
from dualtrain_torch.embeddings import _FROM_FIRST_GRAD, _INITIAL_GLOBALS, probe_state
from dualtrain_torch.transfer import Transfer

__all__ = [
    "DataGadget",
    "ModelFactory",
    "OptimizerFactory",
    "PytorchModelFactory",
    "PytorchOptimizerFactory",
]


def _transfer(device_type: Any = None) -> Transfer:
    """The road for rows to `device_type` (default "cuda" when present, else "cpu")."""
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    return Transfer(device_type)


def _dtype_name(datatype: Any) -> str:
    if isinstance(datatype, torch.dtype):
        return str(datatype).removeprefix("torch.")
    return str(np.dtype(datatype)) if datatype != "bfloat16" else "bfloat16"


def _ids(pos: Any, neg: Any) -> tuple[Any, ...]:
    return (pos,) if neg is None else (pos, neg)


class _Swapped:
    """The batch in hand between beforeForwardPass and afterOptimizerStep."""

    def __init__(self) -> None:
        self.found: Lookup | None = None

    def begin(self, ids: tuple[Any, ...], num_rows: int) -> Lookup:
        self.found = lookup(ids, num_rows)
        return self.found

    def same(self, ids: tuple[Any, ...], num_rows: int) -> Lookup:
        found = lookup(ids, num_rows)
        if self.found is None or not found.same_ids(self.found):
            raise ArgumentError(
                "afterOptimizerStep got other ids than beforeForwardPass; pass the same ones"
            )
        return self.found


class ModelFactory:
    """The rows of a big embedding, swapped into a small ``nn.Embedding`` per batch.

    Args:
        model_variable: the model's small ``nn.Embedding`` (its ``weight`` is swapped).
        total_classes: rows of the big table.
        embed_dimension: values per row.
        datatype: NumPy dtype name or torch dtype of the table.
        CPUPinn: accepted for SpeedTorch compatibility; the table is pinned when CUDA is
            present either way.
        deviceType: where the swapped rows live (default "cuda" if present, else "cpu").
    """

    def __init__(
        self,
        model_variable: torch.nn.Module,
        total_classes: int,
        embed_dimension: int,
        datatype: Any = "float32",
        CPUPinn: bool = False,
        deviceType: str | None = None,
        pinType: bool = False,
    ) -> None:
        if not isinstance(getattr(model_variable, "weight", None), torch.nn.Parameter):
            raise bad_argument(
                "model_variable",
                type(model_variable).__name__,
                "an nn.Embedding (a module with a weight)",
            )
        self.model_variable = model_variable
        self.store = EmbeddingStore(total_classes, embed_dimension, _dtype_name(datatype), "zeros")
        self.transfer = _transfer(deviceType)
        self.device = self.transfer.device
        self._batch = _Swapped()
        self._locals: list[torch.Tensor] = []

    # ---- initialization --------------------------------------------------------------

    def zerosInit(self) -> None:
        self.store.initialize("zeros")

    def uniformDistributionInit(self, low: float, high: float) -> None:
        dim = self.store.dim
        self.store.initialize(lambda rows, rng: rng.uniform(low, high, (len(rows), dim)))

    def normalDistributionInit(self, mean: float, stdev: float) -> None:
        dim = self.store.dim
        self.store.initialize(lambda rows, rng: rng.normal(mean, stdev, (len(rows), dim)))

    def customInit(self, initFunction: Any, *args: Any) -> None:
        """`initFunction(tensor, *args)` fills a tensor in place, as torch.nn.init does."""
        dim = self.store.dim

        def init(rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
            block = torch.empty(len(rows), dim, dtype=torch.float64)
            initFunction(block, *args)
            return block.numpy()

        self.store.initialize(init)

    # ---- the swap --------------------------------------------------------------------

    def variableTransformer(
        self,
        batchSize: int,
        posPerBatch: int,
        negPerBatch: int | None = None,
    ) -> Any:
        """Local ids for the model's forward pass; `beforeForwardPass` rewrites them."""
        pos = torch.arange(batchSize * posPerBatch, device=self.device).view(batchSize, posPerBatch)
        self._locals = [pos]
        if negPerBatch is None:
            return pos
        start = batchSize * posPerBatch
        neg = torch.arange(start, start + batchSize * negPerBatch, device=self.device)
        self._locals.append(neg.view(batchSize, negPerBatch))
        return pos, self._locals[1]

    def beforeForwardPass(self, retrievedPosIndexes: Any, retrievedNegIndexes: Any = None) -> Any:
        """Swaps the batch's unique rows in; the local ids now point at them."""
        found = self._batch.begin(
            _ids(retrievedPosIndexes, retrievedNegIndexes), self.store.num_rows
        )
        capacity = found.inverse.size  # fixed per batch shape, so the parameter keeps its size
        rows = np.zeros((capacity, self.store.dim), self.store.table.dtype)
        np.take(self.store.table, found.unique, axis=0, out=rows[: found.unique.size], mode="clip")
        self.model_variable.weight.data = self.transfer(rows)
        parts = found.parts
        if len(self._locals) != len(parts):
            self._locals = [
                torch.empty(p.shape, dtype=torch.int64, device=self.device) for p in parts
            ]
        for local, part in zip(self._locals, parts, strict=False):
            local.copy_(self.transfer(part).view(local.shape))
        return self._locals[0] if len(self._locals) == 1 else tuple(self._locals)

    def afterOptimizerStep(self, retrievedPosIndexes: Any, retrievedNegIndexes: Any = None) -> None:
        """Writes the batch's updated rows back to the table."""
        found = self._batch.same(
            _ids(retrievedPosIndexes, retrievedNegIndexes), self.store.num_rows
        )
        rows = cast(torch.Tensor, self.model_variable.weight).data[: found.unique.size]
        self.store.table[found.unique] = rows.detach().cpu().numpy()

    # ---- the table -------------------------------------------------------------------

    def getNumpyVersion(self) -> np.ndarray:
        return self.store.table

    def saveCupy(self, saveFileName: str) -> None:
        """Saves the table as ``cupy.save`` does: a .npy file (``.npy`` appended if missing).

        CuPy is not needed: the file is NumPy's format, which ``cupy.load`` reads too.
        """
        save_npy(saveFileName, self.store.table)

    def loadCupy(self, loadFileName: str) -> None:
        """Loads a .npy table (from saveCupy or ``cupy.save``) of this table's shape and dtype."""
        loaded = load_npy(loadFileName, "loadFileName")
        self.store.table[...] = checked(self.store.table, loaded, loadFileName, "loadFileName")

    def saveTorch(self, saveFileName: str) -> None:
        """Saves the table as one tensor with ``torch.save``, to exactly `saveFileName`."""
        save_tensors(saveFileName, convert(self.store.table, to="torch"))

    def loadTorch(self, loadFileName: str) -> None:
        """Loads a tensor saved by saveTorch or by SpeedTorch (``torch.save``), on any device.

        The file is read with ``torch.load(weights_only=True)``: no code in it runs.
        """
        loaded = load_tensors(loadFileName, "loadFileName")
        self.store.table[...] = checked(self.store.table, loaded, loadFileName, "loadFileName")


class OptimizerFactory:
    """The optimizer state of the big embedding, swapped in per batch like its rows.

    Args:
        given_optimizer: the torch optimizer over the model (SGD, Adam, AdamW, Adamax,
            NAdam, RAdam, Adagrad, RMSprop, Adadelta).
        total_classes, embed_dimension: the big table's shape.
        model: the model holding the small embedding.
        variable_name: the embedding's name in ``model.named_parameters()`` (with or
            without ``.weight``).
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
        deviceType: str | None = None,
        pinType: bool = False,
    ) -> None:
        params = dict(model.named_parameters())
        name = variable_name if variable_name in params else f"{variable_name}.weight"
        if name not in params:
            raise bad_argument("variable_name", variable_name, f"one of {sorted(params)}")
        self.optimizer, self.param = given_optimizer, params[name]
        group = next(
            (g for g in given_optimizer.param_groups if any(p is self.param for p in g["params"])),
            None,
        )
        if group is None:
            raise bad_argument(
                "given_optimizer", type(given_optimizer).__name__, f"an optimizer over {name}"
            )
        hyper = {k: v for k, v in group.items() if k not in ("params", "fused", "foreach")}
        hyper = {k: v for k, v in hyper.items() if k in _init_args(type(given_optimizer))}
        dtype_t = getattr(torch, _dtype_name(dtype))
        self._init, self._globals = probe_state(
            type(given_optimizer), hyper, embed_dimension, dtype_t
        )
        self.store = EmbeddingStore(total_classes, embed_dimension, _dtype_name(dtype), "zeros")
        self.transfer = _transfer(self.param.device)  # state follows the parameter
        self._batch = _Swapped()
        self.tables: dict[str, np.ndarray] = {}
        self._stepped = False  # torch builds SGD's buffer from the first gradient itself
        self.optInit()

    def optInit(self) -> None:
        """(Re)allocates one full state table per slot, at the optimizer's initial value."""
        self.tables, self._stepped = {}, False
        for slot, row in self._init.items():
            table = self.store.empty()
            table[...] = row.numpy()
            self.tables[slot] = table

    def beforeForwardPass(self, retrievedPosIndexes: Any, retrievedNegIndexes: Any = None) -> None:
        found = self._batch.begin(
            _ids(retrievedPosIndexes, retrievedNegIndexes), self.store.num_rows
        )
        state = self.optimizer.state[self.param]
        first = not self._stepped
        for name in self._globals:
            state.setdefault(name, torch.tensor(_INITIAL_GLOBALS.get(name, 0.0)))
        capacity = found.inverse.size
        gathered = {}
        for slot, table in self.tables.items():
            if first and isinstance(self.optimizer, _FROM_FIRST_GRAD.get(slot, ())):
                state.pop(slot, None)  # torch creates it from the first gradient
                continue
            rows = np.zeros((capacity, self.store.dim), table.dtype)
            np.take(table, found.unique, axis=0, out=rows[: found.unique.size], mode="clip")
            gathered[slot] = rows
        if self.transfer.device != self.param.device:  # the model moved since
            self.transfer = _transfer(self.param.device)
        state.update(self.transfer(gathered))

    def afterOptimizerStep(self, retrievedPosIndexes: Any, retrievedNegIndexes: Any = None) -> None:
        found = self._batch.same(
            _ids(retrievedPosIndexes, retrievedNegIndexes), self.store.num_rows
        )
        state = self.optimizer.state[self.param]
        self._stepped = True
        for slot, table in self.tables.items():
            if slot in state:
                table[found.unique] = state[slot][: found.unique.size].detach().cpu().numpy()

    def getNumpyVersion(self, slot: str | None = None) -> np.ndarray:
        """A state table (the first slot's by default)."""
        return self.tables[slot or next(iter(self.tables))]

    def saveTorch(self, saveFileName: str) -> None:
        """Saves the state tables as SpeedTorch does: ``torch.save`` of a list, in slot order."""
        tables = [convert(t, to="torch") for t in self.tables.values()]
        save_tensors(saveFileName, tables)

    def loadTorch(self, loadFileName: str) -> None:
        """Loads the list saveTorch wrote; every table is checked before any is changed."""
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


class DataGadget:
    """Rows of a ``.npy`` file served to torch by id, and written back.

    Args:
        fileName: the ``.npy`` file (a 2-D array).
        CPUPinn: accepted for compatibility; pinned when CUDA is present.
    """

    def __init__(self, fileName: str, CPUPinn: bool = False) -> None:
        self.fileName = fileName
        self.data: np.ndarray | None = None
        self.transfer = _transfer()
        self.device = self.transfer.device

    def gadgetInit(self) -> None:
        loaded = np.load(self.fileName, mmap_mode="r")
        if loaded.ndim != 2:
            raise bad_argument("fileName", self.fileName, "a .npy file of a 2-D array")
        self.data = np.array(loaded)

    def _table(self) -> np.ndarray:
        if self.data is None:
            raise ArgumentError("call gadgetInit() before getData/insertData")
        return self.data

    def getData(self, indexes: Any) -> torch.Tensor:
        table = self._table()
        ids = as_ids(indexes, len(table), "indexes")
        return self.transfer(np.take(table, ids, axis=0))

    def insertData(self, dataObject: torch.Tensor, indexes: Any) -> None:
        """Writes rows; of repeated ids the last occurrence wins (always, unlike SpeedTorch)."""
        table = self._table()
        ids = as_ids(indexes, len(table), "indexes").ravel()
        values = dataObject.detach().cpu().numpy().reshape(ids.size, -1)
        table[ids] = values  # NumPy assigns in order, so the last occurrence is what stays

    def getNumpyVersion(self) -> np.ndarray:
        return self._table()

    def saveCupy(self, saveFileName: str) -> None:
        """Saves the data as ``cupy.save`` does: a .npy file (``.npy`` appended if missing)."""
        save_npy(saveFileName, self._table())

    def loadCupy(self, loadFileName: str) -> None:
        """Replaces the data with a 2-D array from a .npy file, as SpeedTorch's loadCupy."""
        loaded = load_npy(loadFileName, "loadFileName")
        if loaded.ndim != 2:
            raise bad_argument("loadFileName", loadFileName, "a .npy file of a 2-D array")
        self.data = np.array(loaded)


PytorchModelFactory = ModelFactory
PytorchOptimizerFactory = OptimizerFactory
