"""Activation and reshaping modules: ``SiLU``, ``Tanh``, ``Sigmoid``, ``Softmax``,
``LogSoftmax``, ``Softplus``, ``LeakyReLU``, ``Flatten``, ``Unflatten`` (``GELU``, ``ReLU``
and ``Identity`` live in :mod:`ctensor.nn.layers`). Each wraps the functional op of the
same name, so it runs on every layout."""
from __future__ import annotations

import warnings
from typing import Optional, Sequence

from . import functional as F
from .module import Module

__all__ = ["SiLU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "Softplus", "LeakyReLU",
           "ELU", "SELU", "Mish", "ReLU6", "Hardswish", "Hardtanh", "LogSigmoid", "GLU",
           "Flatten", "Unflatten"]


class SiLU(Module):
    """``x * sigmoid(x)``.

    >>> nn.SiLU()(x)
    """

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, x):
        return F.silu(x, self.inplace)


class Tanh(Module):
    """Hyperbolic tangent."""

    def forward(self, x):
        return F.tanh(x)


class Sigmoid(Module):
    """``1 / (1 + exp(-x))``."""

    def forward(self, x):
        return F.sigmoid(x)


def _softmax_dim(name: str, dim: Optional[int], ndim: int) -> int:
    """PyTorch's legacy choice when ``dim`` is None (0 for 0-, 1- and 3-D inputs, else 1),
    with its warning."""
    if dim is not None:
        return dim
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the "
                  f"call to include dim=X as an argument.", UserWarning, stacklevel=3)
    return 0 if ndim in (0, 1, 3) else 1


class Softmax(Module):
    """Softmax along ``dim``.

    >>> nn.Softmax(dim=-1)(scores)
    """

    def __init__(self, dim: Optional[int] = None):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.softmax(x, _softmax_dim("softmax", self.dim, x.ndim))

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Module):
    """Log-softmax along ``dim``."""

    def __init__(self, dim: Optional[int] = None):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.log_softmax(x, _softmax_dim("log_softmax", self.dim, x.ndim))

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softplus(Module):
    """``log(1 + exp(beta x)) / beta`` (linear above ``threshold``)."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x):
        return F.softplus(x, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class LeakyReLU(Module):
    """``x`` for positive ``x``, else ``negative_slope * x``."""

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class Flatten(Module):
    """Flatten dims ``start_dim..end_dim`` into one (PyTorch's default keeps the batch dim:
    ``start_dim=1``).

    >>> nn.Flatten()(ct.zeros(2, 3, 4)).shape
    (2, 12)
    """

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """Expand dim ``dim`` into ``unflattened_size`` (the inverse of :class:`Flatten`).

    >>> nn.Unflatten(1, (3, 4))(ct.zeros(2, 12)).shape
    (2, 3, 4)
    """

    def __init__(self, dim: int, unflattened_size: Sequence[int]):
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, x):
        dim = self.dim % x.ndim if x.ndim else 0
        shape = tuple(x.shape[:dim]) + self.unflattened_size + tuple(x.shape[dim + 1:])
        return x.reshape(*shape)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


class _Elementwise(Module):
    """An activation module with an ``inplace`` flag, calling ``F.<name>``."""

    _name = ""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = bool(inplace)

    def forward(self, x):
        return getattr(F, self._name)(x, inplace=self.inplace)


class ELU(Module):
    """``x`` for positive ``x``, else ``alpha (exp(x) - 1)``."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        self.alpha, self.inplace = alpha, bool(inplace)

    def forward(self, x):
        return F.elu(x, self.alpha, self.inplace)


class SELU(_Elementwise):
    """Scaled ELU with SELU's constants."""

    _name = "selu"


class Mish(_Elementwise):
    """``x * tanh(softplus(x))``."""

    _name = "mish"


class ReLU6(_Elementwise):
    """``min(max(x, 0), 6)``."""

    _name = "relu6"


class Hardswish(_Elementwise):
    """``x * relu6(x + 3) / 6``."""

    _name = "hardswish"


class Hardtanh(Module):
    """``x`` clipped to ``[min_val, max_val]``."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False,
                 min_value: Optional[float] = None, max_value: Optional[float] = None):
        super().__init__()
        # min_value / max_value: PyTorch's deprecated spellings, which win when given
        min_val = min_val if min_value is None else min_value
        max_val = max_val if max_value is None else max_value
        self.min_val, self.max_val, self.inplace = min_val, max_val, bool(inplace)

    def forward(self, x):
        return F.hardtanh(x, self.min_val, self.max_val, self.inplace)


class LogSigmoid(Module):
    """``log(sigmoid(x))``, stably."""

    def forward(self, x):
        return F.logsigmoid(x)


class GLU(Module):
    """Gated linear unit along ``dim``."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.glu(x, self.dim)
