"""Adam and AdamW (decoupled weight decay), PyTorch's update rules.

With ``m, v`` the first and second moment estimates after ``t`` steps::

    m <- b1 m + (1 - b1) g          v <- b2 v + (1 - b2) g^2
    p <- p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

Adam adds ``weight_decay * p`` to ``g`` (L2); AdamW instead shrinks ``p`` by
``(1 - lr * weight_decay)`` before the step. ``amsgrad`` uses the running maximum of ``v``.
"""
from __future__ import annotations

import math
from typing import Optional

import ctensor as ct

from . import foreach
from .optimizer import Optimizer, _require

__all__ = ["Adam", "AdamW"]


class Adam(Optimizer):
    """Adam with L2 weight decay.

    >>> opt = optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999))
    """

    decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False,
                 shard_states_along: Optional[int] = None, foreach: Optional[bool] = None):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=amsgrad,
                                      foreach=foreach), shard_states_along)

    def _foreach_kernel(self, group: dict):
        """The multi-tensor update (``foreach``, :mod:`optim.foreach`): on unless
        ``foreach=False`` or ``amsgrad``; the same kernel as one parameter's update."""
        if group["amsgrad"] or group["foreach"] is False:
            return None
        beta1, beta2 = group["betas"]
        attrs = dict(lr=float(group["lr"]), beta1=beta1, beta2=beta2, eps=float(group["eps"]),
                     weight_decay=float(group["weight_decay"]), decoupled=self.decoupled)
        return ("exp_avg", "exp_avg_sq"), foreach.adam_kernel, \
            lambda step: dict(attrs, step=int(step))

    def _check_group(self, group: dict) -> None:
        super()._check_group(group)
        name = type(self).__name__
        betas = group["betas"]
        _require(name, "betas", betas, isinstance(betas, (tuple, list)) and len(betas) == 2
                 and all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in betas),
                 "a pair of numbers in [0, 1)")
        group["betas"] = tuple(float(b) for b in betas)
        for key in ("eps", "weight_decay"):
            v = group[key]
            _require(name, key, v, isinstance(v, (int, float)) and v >= 0, "a number >= 0")
        foreach = group.setdefault("foreach", None)
        _require(name, "foreach", foreach, foreach in (None, True, False), "None, True or False")

    def _init_state(self, p, state: dict, zeros) -> None:
        state["step"] = 0
        state["exp_avg"] = zeros()
        state["exp_avg_sq"] = zeros()

    def _update(self, param: ct.Tensor, grad: ct.Tensor, state: dict, group: dict):
        beta1, beta2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        state["step"] += 1
        t = state["step"]
        if not group["amsgrad"]:  # one kernel for the whole update (the same arithmetic)
            new, state["exp_avg"], state["exp_avg_sq"] = ct.fused_adam(
                param, grad, state["exp_avg"], state["exp_avg_sq"], lr=lr, beta1=beta1,
                beta2=beta2, eps=group["eps"], weight_decay=wd, decoupled=self.decoupled,
                step=t)
            return new
        if wd and self.decoupled:
            param = param * (1.0 - lr * wd)
        elif wd:
            grad = grad + param * wd
        m = state["exp_avg"] * beta1 + grad * (1.0 - beta1)
        v = state["exp_avg_sq"] * beta2 + grad * grad * (1.0 - beta2)
        state["exp_avg"], state["exp_avg_sq"] = m, v
        vmax = state.get("max_exp_avg_sq")  # (amsgrad: the unfused path's only user)
        v = v if vmax is None else ct.maximum(vmax, v)
        state["max_exp_avg_sq"] = v
        step_size = lr / (1.0 - beta1 ** t)
        denom = ct.sqrt(v) / math.sqrt(1.0 - beta2 ** t) + group["eps"]
        return param - m / denom * step_size


class AdamW(Adam):
    """Adam with decoupled weight decay (default 0.01), as in Loshchilov & Hutter.

    >>> opt = optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    """

    decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False,
                 shard_states_along: Optional[int] = None, foreach: Optional[bool] = None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, shard_states_along,
                         foreach)
