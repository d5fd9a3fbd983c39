"""ctensor.nn: modules and functional ops built on the public ctensor API.

Modules are built on every rank (broadcast) and laid out afterwards with
``Module.to_global(placement, sbp_or_rules)`` or :mod:`ctensor.nn.parallel`; no module
communicates by itself.
"""
from . import functional  # noqa: F401
from .module import Module, Parameter
from .layers import (Linear, Embedding, LayerNorm, Dropout, GELU, ReLU, Identity, Sequential,
                     ModuleList, ModuleDict)
from .transformer import CausalSelfAttention, MLP, Block, GPT
from .fsdp import fully_shard, mixed_precision, compute_dtype
from . import fsdp, parallel, utils

__all__ = ["functional", "Module", "Parameter", "Linear", "Embedding", "LayerNorm", "Dropout",
           "GELU", "ReLU", "Identity", "Sequential", "ModuleList", "ModuleDict",
           "CausalSelfAttention", "MLP", "Block", "GPT",
           "parallel", "utils", "fsdp", "fully_shard", "mixed_precision", "compute_dtype"]
