"""What Multiverse reads of torch.distributed before joining a run (imports no torch)."""

from __future__ import annotations

from dualtrain.multiverse.seams import DistributedTraits

__all__ = ["TRAITS"]

# One process a device, joined at rank 0's store when first needed; sync wraps models in
# DistributedDataParallel, which takes these keywords.
TRAITS = DistributedTraits(
    name="torch",
    engines=("jit",),
    engines_hint="'jit' (DDP) under torch",
    one_process_per_device=True,
    sync_options=(
        "bucket_cap_mb",
        "find_unused_parameters",
        "broadcast_buffers",
        "gradient_as_bucket_view",
        "static_graph",
    ),
    wraps_models=True,
)
