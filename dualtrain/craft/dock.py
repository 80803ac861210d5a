"""The neutral layer set. Each layer is a frozen spec: sizes and options, no arrays.

Data are channels-first, as in torch: Dense takes ``(..., in)``; Conv and pooling take
``(N, C, *spatial)``; BatchNorm takes ``(N, C, ...)``. The canonical parameter layouts are
torch's, so torch modules and checkpoints hold them as they are; JAX contracts them directly
(``lax.dot_general``, ``OIHW`` kernels) at no cost:

=============  ===================================  ==============================
layer          parameter: shape                     initial value
=============  ===================================  ==============================
Dense          weight ``(out, in)``, bias ``(out,)``  U(±1/sqrt(in))
Conv           weight ``(out, in/groups, *kernel)``  U(±1/sqrt(in/groups·prod(kernel)))
ConvTranspose  weight ``(in, out/groups, kh, kw)``  U(±1/sqrt(out/groups·kh·kw))
BatchNorm      weight, bias ``(C,)``; state          ones, zeros; running_mean 0,
               running_mean, running_var ``(C,)``   running_var 1
LayerNorm      weight, bias ``shape``               ones, zeros
Embedding      weight ``(num, dim)``                N(0, 1)
=============  ===================================  ==============================

Calling a layer inside ``Craft.run`` runs it on the backend of the realized module. The
same spec object used twice is one layer: its weights are tied. Sizes given as an int or a
tuple (kernel, stride, ...) are stored as tuples after construction.

Each spec checks its inputs in ``check_input(x, *rest, train=..., **kwargs)``, which every
backend calls before running the layer, so torch, JAX and the NumPy reference refuse the
same inputs with the same error. The specs live in `dualtrain.craft.specs`, one module per
kind; this module is their public home.
"""

from __future__ import annotations

from dualtrain.craft import ops
from dualtrain.craft.ops import (  # the functional ops live in dock too: dock.relu(x)
    accuracy as accuracy,
    add as add,
    concat as concat,
    cross_entropy as cross_entropy,
    gelu as gelu,
    log_softmax as log_softmax,
    matmul as matmul,
    mean as mean,
    pad as pad,
    relu as relu,
    sigmoid as sigmoid,
    softmax as softmax,
    tanh as tanh,
)
from dualtrain.craft.specs.base import Layer as Layer
from dualtrain.craft.specs.containers import Native as Native, Sequential as Sequential
from dualtrain.craft.specs.conv import Conv as Conv, ConvTranspose as ConvTranspose
from dualtrain.craft.specs.dropout import Dropout as Dropout
from dualtrain.craft.specs.linear import Dense as Dense, Embedding as Embedding
from dualtrain.craft.specs.norm import BatchNorm as BatchNorm, LayerNorm as LayerNorm
from dualtrain.craft.specs.pool import (
    AvgPool as AvgPool,
    GlobalAvgPool as GlobalAvgPool,
    GlobalMaxPool as GlobalMaxPool,
    MaxPool as MaxPool,
)
from dualtrain.craft.specs.shape import Flatten as Flatten, Reshape as Reshape
from dualtrain.deprecation import seed_spellings

__all__ = [
    "AvgPool",
    "BatchNorm",
    "Conv",
    "ConvTranspose",
    "Dense",
    "Dropout",
    "Embedding",
    "Flatten",
    "GlobalAvgPool",
    "GlobalMaxPool",
    "Layer",
    "LayerNorm",
    "MaxPool",
    "Native",
    "Reshape",
    "Sequential",
    *ops.__all__,
]

# Seed spellings served with a warning (dualtrain.deprecation.SEED_SPELLINGS).
__getattr__ = seed_spellings(__name__, ("Craft",))
