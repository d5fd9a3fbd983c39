"""``fused_adam``: one Adam / AdamW update of a parameter and its two moments in one kernel.

What ``ctensor.optim.Adam`` and ``AdamW`` run per parameter (the arithmetic of
``optim/adam.py``'s unfused update, in the same order): one op instead of about fourteen,
so a step of a model with many small parameters costs what its arithmetic costs. Elementwise
over four tensors of one shape laid out alike: B..->B and S(d)..->S(d); a partial input is
reduced first (the optimizer hands it gradients already in the states' layout).
"""
from __future__ import annotations

import math

from ._rules import B, S, defop, sig

__all__ = ["fused_adam"]


def _kernel(xp, p, g, m, v, lr, beta1, beta2, eps, weight_decay, decoupled, step):
    # (in place on fresh arrays only: the same operations in the same order as the unfused
    # update, so the same bits, with fewer temporaries)
    if weight_decay and decoupled:
        p = p * (1.0 - lr * weight_decay)
    elif weight_decay:
        g = g + p * weight_decay
    m = m * beta1
    m += g * (1.0 - beta1)
    gg = g * g
    gg *= 1.0 - beta2
    v = v * beta2
    v += gg
    denom = xp.sqrt(v)
    denom /= math.sqrt(1.0 - beta2 ** step)
    denom += eps
    update = m / denom
    update *= lr / (1.0 - beta1 ** step)
    return p - update, m, v


def _meta(layouts, **_):
    p = layouts[0]
    for name, l in zip(("grad", "exp_avg", "exp_avg_sq"), layouts[1:]):
        if l.shape != p.shape or l.dtype != p.dtype:
            raise ValueError(f"fused_adam: argument '{name}' is {l.dtype} {tuple(l.shape)}, "
                             f"expected the parameter's {p.dtype} {tuple(p.shape)}")
    if p.dtype.kind != "f":
        raise TypeError(f"fused_adam: the parameter must be floating, got {p.dtype}")
    return [(tuple(p.shape), p.dtype)] * 3


def _signatures(layouts, **_):
    ndim = layouts[0].ndim
    return [sig([B] * 4, (B, B, B))] + [sig([S(d)] * 4, (S(d),) * 3) for d in range(ndim)]


@defop(kernel=_kernel, meta=_meta, signatures=_signatures, n_outputs=3,
       value_attrs=("lr", "beta1", "beta2", "eps", "weight_decay", "step"))
def fused_adam(op, param, grad, exp_avg, exp_avg_sq, *, lr: float, beta1: float,
               beta2: float, eps: float, weight_decay: float = 0.0, decoupled: bool = True,
               step: int = 1):
    """``(new param, new exp_avg, new exp_avg_sq)`` after Adam step ``step`` (PyTorch's
    rule; ``decoupled=True``: AdamW's weight decay, else L2 added to the gradient). No
    gradient flows through it.

    >>> p2, m2, v2 = ct.fused_adam(p, g, m, v, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
    ...                            weight_decay=0.01, step=1)
    """
    return op(param, grad, exp_avg, exp_avg_sq, lr=float(lr), beta1=float(beta1),
              beta2=float(beta2), eps=float(eps), weight_decay=float(weight_decay),
              decoupled=bool(decoupled), step=int(step))
