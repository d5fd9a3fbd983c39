"""Stochastic gradient descent with momentum, Nesterov momentum, dampening and L2 weight
decay (PyTorch's update rule)."""
from __future__ import annotations

from typing import Optional

import ctensor as ct

from .optimizer import Optimizer, _require

__all__ = ["SGD"]


class SGD(Optimizer):
    """``p <- p - lr * d`` where ``d = g + weight_decay * p``, with momentum
    ``buf <- momentum * buf + (1 - dampening) * d`` (``buf = d`` on the first step) and
    ``d = buf`` (or ``d + momentum * buf`` when ``nesterov``).

    >>> opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    """


    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                 shard_states_along: Optional[int] = None):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov),
                         shard_states_along)

    def _check_group(self, group: dict) -> None:
        super()._check_group(group)
        for key in ("momentum", "dampening", "weight_decay"):
            v = group[key]
            _require("SGD", key, v, isinstance(v, (int, float)) and v >= 0, "a number >= 0")
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError(f"SGD: nesterov=True needs momentum > 0 and dampening 0, got "
                             f"momentum={group['momentum']}, dampening={group['dampening']}")

    def _init_state(self, p, state: dict, zeros) -> None:
        state["step"] = 0

    def _update(self, param: ct.Tensor, grad: ct.Tensor, state: dict, group: dict):
        state["step"] += 1
        d = grad
        if group["weight_decay"]:
            d = d + param * group["weight_decay"]
        momentum = group["momentum"]
        if momentum:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = ct.clone(d)
            else:
                buf = buf * momentum + d * (1.0 - group["dampening"])
            state["momentum_buffer"] = buf
            d = d + buf * momentum if group["nesterov"] else buf
        return param - d * group["lr"]
