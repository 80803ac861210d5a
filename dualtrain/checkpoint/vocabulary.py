"""The words anchor files use: format versions, backend names, optimizer slot names.

One vocabulary for both kinds of anchor (a Craft's, an embedding store's), and the
translation of what older formats said into it, so that the readers see one language:

- **format**: every manifest carries ``format``, ``<kind>/<version>``. This version writes
  `CRAFT_FORMAT` and `EMBEDDINGS_FORMAT` (a sharded store: `EMBEDDINGS_SET_FORMAT` and
  `EMBEDDINGS_PART_FORMAT`); it reads the formats of `CRAFT_READS` and
  `EMBEDDINGS_READS`, those in `WITHOUT_CRC` without the CRC-32s they predate.
- **backend**: the registry's names, ``"torch"`` and ``"jax"`` (``dualtrain.backends``), in
  the manifest's ``backend`` and the optimizer entry's ``framework``. Embedding anchors
  before ``/3`` wrote the adapter's package (``"dualtrain_torch"``); `upgrade` translates.
- **slots**: torch's state keys (``momentum_buffer``, ``exp_avg``, ``exp_avg_sq``,
  ``square_avg``, ``grad_avg``, ``sum``, ``step``) in every neutral view and every embedding
  anchor. The first Craft anchors called SGD's buffer ``momentum`` (`SLOT_ALIASES`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BACKENDS",
    "BACKEND_ALIASES",
    "CHUNKED_CRC32C",
    "CRAFT_FORMAT",
    "CRAFT_READS",
    "EMBEDDINGS_FORMAT",
    "EMBEDDINGS_READS",
    "EMBEDDINGS_SET_FORMAT",
    "EMBEDDINGS_PART_FORMAT",
    "SLOT_ALIASES",
    "WITHOUT_CRC",
    "backend_name",
    "slot_name",
    "upgrade",
]

CRAFT_FORMAT = "dualtrain-checkpoint/4"
EMBEDDINGS_FORMAT = "dualtrain-embeddings/4"
# A store sharded across a run's processes is written as a set: one part file a process
# (`EMBEDDINGS_PART_FORMAT`, its range of rows) and the set's manifest (`EMBEDDINGS_SET_FORMAT`,
# no tensors), written last, which names every part and commits the set
# (``checkpoint.embedding_sets``). The single-file anchor stays `EMBEDDINGS_FORMAT`.
EMBEDDINGS_SET_FORMAT = "dualtrain-embeddings-set/1"
EMBEDDINGS_PART_FORMAT = "dualtrain-embeddings-part/1"
# Every format this version reads, the newest first. /2 added the CRC-32s (header and
# tensors); /3 named the backend in embedding anchors as Craft anchors do; /4 checks the
# tensors by CRC-32C (in hardware) per 32 MiB chunk, so one large tensor is checked on
# every core (`crc32c`, a list per tensor, instead of `crc32`).
CRAFT_READS = (
    CRAFT_FORMAT, "dualtrain-checkpoint/3", "dualtrain-checkpoint/2", "dualtrain-checkpoint/1"
)  # fmt: skip
EMBEDDINGS_READS = (
    EMBEDDINGS_FORMAT, "dualtrain-embeddings/3", "dualtrain-embeddings/2",
    "dualtrain-embeddings/1",
)  # fmt: skip
# Formats written before the CRC-32s: read with every check but those.
WITHOUT_CRC = frozenset({"dualtrain-checkpoint/1", "dualtrain-embeddings/1"})
# Formats whose tensors carry chunked CRC-32Cs (`crc32c`); the others with CRCs, `crc32`.
CHUNKED_CRC32C = frozenset(
    {CRAFT_FORMAT, EMBEDDINGS_FORMAT, EMBEDDINGS_SET_FORMAT, EMBEDDINGS_PART_FORMAT}
)

BACKENDS = ("torch", "jax")
# What embedding anchors before /3 wrote for the backend: the adapter's package.
BACKEND_ALIASES = {"dualtrain_torch": "torch", "dualtrain_jax": "jax"}
# Slot names of the first Craft anchors' neutral optimizer state (tensors
# ``optimizer.<slot>.<name>``), in torch's words.
SLOT_ALIASES = {"momentum": "momentum_buffer"}


def backend_name(name: Any) -> Any:
    """The registry's name for a backend (``"dualtrain_torch"`` -> ``"torch"``).

    Anything else (a name of the vocabulary, or a malformed value the caller reports) is
    returned as it is.
    """
    return BACKEND_ALIASES.get(name, name) if isinstance(name, str) else name


def slot_name(slot: str) -> str:
    """The torch name of an optimizer slot (``"momentum"`` -> ``"momentum_buffer"``)."""
    return SLOT_ALIASES.get(slot, slot)


def upgrade(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest of any format read in this version's words (a new dict; `format` kept).

    The backend (``backend``, the optimizer's ``framework``) gets the registry's name. Tensor
    names are the file's and stay as they are: readers translate the slot in a legacy
    neutral tensor name (``optimizer.momentum.<name>``) with `slot_name`.
    """
    out = dict(manifest)
    if "backend" in out:
        out["backend"] = backend_name(out["backend"])
    optimizer = out.get("optimizer")
    if isinstance(optimizer, dict) and "framework" in optimizer:
        out["optimizer"] = {**optimizer, "framework": backend_name(optimizer["framework"])}
    return out
