"""ctensor.nn: modules and functional ops built on the public ctensor API.

Modules are built on every rank (broadcast) and laid out afterwards with
``Module.to_global(placement, sbp_or_rules)`` or :mod:`ctensor.nn.parallel`; no module
communicates by itself.
"""
from . import functional  # noqa: F401
from .module import Module, Parameter
from .layers import (Linear, Embedding, LayerNorm, RMSNorm, Dropout, GELU, ReLU, Identity,
                     Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict)
from .activation import (SiLU, Tanh, Sigmoid, Softmax, LogSoftmax, Softplus, LeakyReLU,
                         ELU, SELU, Mish, ReLU6, Hardswish, Hardtanh, LogSigmoid, GLU,
                         Flatten, Unflatten)
from .attention import MultiheadAttention, TransformerEncoderLayer, TransformerEncoder
from .normalization import BatchNorm1d, BatchNorm2d, BatchNorm3d
from .losses import (CrossEntropyLoss, NLLLoss, MSELoss, L1Loss, SmoothL1Loss, HuberLoss,
                     BCELoss, BCEWithLogitsLoss, KLDivLoss)
from . import init
from .transformer import CausalSelfAttention, MLP, Block, GPT
from .moe import MoE
from .fsdp import fully_shard, mixed_precision
from .precision import compute_dtype
from . import fsdp, moe, parallel, utils

__all__ = ["functional", "init", "Module", "Parameter", "Linear", "Embedding", "LayerNorm",
           "RMSNorm", "Dropout", "GELU", "ReLU", "Identity", "Sequential", "ModuleList",
           "ModuleDict", "ParameterList", "ParameterDict", "SiLU", "Tanh", "Sigmoid",
           "Softmax", "LogSoftmax", "Softplus", "LeakyReLU", "ELU", "SELU", "Mish", "ReLU6",
           "Hardswish", "Hardtanh", "LogSigmoid", "GLU", "Flatten", "Unflatten",
           "MultiheadAttention", "TransformerEncoderLayer", "TransformerEncoder",
           "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "CrossEntropyLoss", "NLLLoss",
           "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "BCELoss", "BCEWithLogitsLoss",
           "KLDivLoss",
           "CausalSelfAttention", "MLP", "Block", "GPT", "MoE",
           "parallel", "utils", "fsdp", "fully_shard", "mixed_precision", "compute_dtype"]
