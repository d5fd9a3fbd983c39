"""ctensor: a distributed eager tensor library with a consistent (global) view.

Write a script against *logical* tensors; choose where each lives (:func:`placement`)
and how it is laid out (:mod:`ctensor.sbp`); ctensor inserts every collective.

>>> import ctensor as ct
>>> with ct.simulate(2):
...     x = ct.ones(4, 3, placement=ct.placement("cpu", [0, 1]), sbp=ct.sbp.split(0))
...     y = x.to_global(sbp=ct.sbp.broadcast)        # all-gather
"""
from . import hostmalloc as _hostmalloc  # noqa: F401  (glibc keeps what a step frees)
from . import sbp
from .dtypes import (float16, float32, float64, int8, int16, int32, int64, uint8,
                     bool_ as bool)  # NumPy dtypes; NumPy has no bfloat16  # noqa: A001
# PyTorch's short dtype names (the casts are methods: x.float(), x.long(), ...)
from .dtypes import half, float_ as float, double, short, int_ as int, long  # noqa: A001
from .placement import placement, Placement
from .runtime import (simulate, launched_by_mpi, rank, world_size, set_default_dtype,
                      get_default_dtype, set_default_device)
from .tensor import Tensor, is_tensor, numel, is_floating_point
from .creation import (tensor, from_local, zeros, ones, full, arange, zeros_like, ones_like,
                       full_like, empty, empty_like, eye, linspace, logspace, from_numpy,
                       as_tensor)
from .random import (manual_seed, seed, initial_seed, Generator, default_generator, rand, randn,
                     randint, rand_like, randn_like, randint_like, randperm)
from . import ops as _ops  # noqa: F401  (declares every op)
from .ops.attention import zigzag_index  # the sequence order of balanced causal attention
from . import linalg  # ct.linalg.norm, vector_norm, matrix_norm (torch.linalg names)
from . import autograd, debug
from . import meta, plan  # shape-only tensors; ct.plan: memory, communication, step time
from . import cuda  # ct.cuda.is_available(), device_count(); CuPy is imported lazily
from .checkpoint import save, load, SaveHandle, ChecksumError
from .autograd import no_grad, enable_grad, is_grad_enabled
from .grad_mode import inference_mode
from .errors import (CollectiveError, DivergenceError, CommTimeoutError, RankExitedError,
                     MetaModeError)
from .pending import PendingTensor
from .registry import OPS as _OPS
from . import stepplan as _stepplan  # the step plan: learned, solved, replayed (on by default)
from .stepplan import step_plan
from . import stepview as _stepview
debug.step_plan = _stepview.report  # ct.debug.step_plan(): what the plan chose, per op

__version__ = "0.1.0"


def __getattr__(name: str):
    # ct.matmul, ct.cat, ct.where, ... are the registered op functions
    try:
        return getattr(_OPS, name)
    except AttributeError:
        raise AttributeError(f"module 'ctensor' has no attribute {name!r}") from None
