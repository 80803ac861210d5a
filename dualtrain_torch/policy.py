"""torch's answers to the questions the neutral core puts to every adapter, as data.

The core never asks which framework it runs on; it reads this module through
`dualtrain.backends.policy("torch")`, which imports no torch: the compile ladder's rungs
(eager PyTorch is both the reference and where a job starts) and model batching's
strategies (``"chunked"`` and ``"stacked"`` are torch's own).
"""

from __future__ import annotations

from dualtrain.accelerate.rungs import Ladder
from dualtrain.batching.members import Strategies

__all__ = ["LADDER", "STRATEGIES"]

# The compile ladder (docs/acceleration.md). Eager torch is both the reference and the start.
# What backends=None tries: COMPILED_STEP needs a loss and an optimizer (TrainingLearner adds
# it); ONNXRUNTIME applies to evaluation under no_grad, with the `onnx` extra.
LADDER = Ladder(
    rungs={
        "TORCH_COMPILE": "torch.compile (inductor) of the forward; backward through AOTAutograd",
        "COMPILED_STEP": "the whole step (forward, loss, backward, the optimizer's update) under "
        "torch.compile (TrainingLearner.step); backward() is a graph break",
        "CHANNELS_LAST": "4-D inputs in NHWC memory format, for models with 2-D convolutions",
        "CUDA_GRAPHS": "torch.compile mode 'reduce-overhead' (CUDA graphs; CUDA only)",
        "ONNXRUNTIME": "ONNX Runtime: inference sessions in eval mode, ORTModule in training "
        "(the onnxruntime-training package)",
        "RAMMER": "Rammer (nnfusion): accepted for nebulgym scripts, never available",
        "TORCHSCRIPT": "torch.jit.trace: accepted for nebulgym scripts, never tried (it froze "
        "train/eval mode and data-dependent branches)",
        "PYTORCH": "eager PyTorch, the reference",
    },
    eager="PYTORCH",
    start="PYTORCH",
    defaults=("CHANNELS_LAST", "TORCH_COMPILE", "ONNXRUNTIME", "CUDA_GRAPHS", "PYTORCH"),
)

# Model batching's ways to run the members ("auto" measures them and keeps the fastest):
# vmap's form in chunks is "chunked", even chunks of at most dispatch.CHUNK members.
STRATEGIES = Strategies(("vmap", "chunked", "loop", "stacked"), "chunked", even_chunks=True)
