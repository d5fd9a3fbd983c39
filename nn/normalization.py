"""``nn.BatchNorm1d`` / ``BatchNorm2d`` / ``BatchNorm3d`` with PyTorch's arguments, buffers
(``running_mean``, ``running_var``, ``num_batches_tracked``) and update rule.

Written with ctensor ops: the batch statistics are means over every dim but the channel
dim, so a batch split over ranks (data parallel) reduces them over all ranks — the
statistics of the whole logical batch, as one process computes them (PyTorch's
``SyncBatchNorm``; plain ``BatchNorm`` under DDP would use each rank's part). The result is
therefore the same for every layout.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

import ctensor as ct

from ._checks import check_float
from .layers import _dtype, _positive, check_device
from .module import Module, Parameter

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d"]


class _BatchNorm(Module):
    _ndims: tuple = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device=None,
                 dtype=None, *, bias: bool = True):
        super().__init__()
        name = type(self).__name__
        check_device(name, device)
        self.num_features = _positive(name, "num_features", num_features)
        self.eps, self.momentum = float(eps), momentum
        self.affine, self.track_running_stats = bool(affine), bool(track_running_stats)
        dt = _dtype(dtype)
        c = self.num_features
        if self.affine:
            self.weight = Parameter(ct.ones(c, dtype=dt))
            if bias:
                self.bias = Parameter(ct.zeros(c, dtype=dt))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if self.track_running_stats:
            self.register_buffer("running_mean", ct.zeros(c, dtype=dt))
            self.register_buffer("running_var", ct.ones(c, dtype=dt))
            self.register_buffer("num_batches_tracked", ct.tensor(np.int64(0)))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def _check_input(self, x) -> None:
        name = type(self).__name__
        check_float(name, "input", x)
        if x.ndim not in self._ndims or x.shape[1] != self.num_features:
            raise ValueError(f"{name}: expected a {' or '.join(f'{n}-D' for n in self._ndims)} "
                             f"input with {self.num_features} channels in dim 1, got shape "
                             f"{tuple(x.shape)}")

    def forward(self, x: ct.Tensor) -> ct.Tensor:
        self._check_input(x)
        dims = (0,) + tuple(range(2, x.ndim))
        shape = (1, self.num_features) + (1,) * (x.ndim - 2)
        use_batch = self.training or not self.track_running_stats
        if use_batch:
            count = int(np.prod([x.shape[d] for d in dims]))
            if count <= 1:
                raise ValueError(f"{type(self).__name__}: expected more than 1 value per "
                                 f"channel when training, got input of shape "
                                 f"{tuple(x.shape)}")
            mean = x.mean(dims, keepdim=True)
            centred = x - mean
            var = (centred * centred).mean(dims, keepdim=True)
            y = centred * ct.rsqrt(var + self.eps)
            if self.training and self.track_running_stats:
                self._update(mean.detach().reshape(self.num_features),
                             var.detach().reshape(self.num_features) * (count / (count - 1)))
        else:
            y = (x - self.running_mean.reshape(*shape)) * \
                ct.rsqrt(self.running_var.reshape(*shape) + self.eps)
        if self.weight is not None:
            y = y * self.weight.reshape(*shape)
        if self.bias is not None:
            y = y + self.bias.reshape(*shape)
        return y

    def _update(self, mean, unbiased_var) -> None:
        """PyTorch's running statistics: an exponential average with ``momentum``, or the
        cumulative average when ``momentum`` is None."""
        with ct.no_grad():
            self.num_batches_tracked.copy_(self.num_batches_tracked + 1)
            m = 1.0 / float(self.num_batches_tracked.item()) if self.momentum is None \
                else float(self.momentum)
            for buf, new in ((self.running_mean, mean), (self.running_var, unbiased_var)):
                buf.copy_(buf * (1.0 - m) + new.to(buf.dtype) * m)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch normalisation of ``(N, C)`` or ``(N, C, L)`` inputs.

    >>> bn = nn.BatchNorm1d(16)
    """

    _ndims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalisation of ``(N, C, H, W)`` inputs."""

    _ndims = (4,)


class BatchNorm3d(_BatchNorm):
    """Batch normalisation of ``(N, C, D, H, W)`` inputs."""

    _ndims = (5,)
