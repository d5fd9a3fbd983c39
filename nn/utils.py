"""``clip_grad_norm_``: the global gradient norm over every parameter, in any layout.

The norm is computed with ctensor ops, so each parameter's contribution is reduced over
its own shards by dispatch (a split gradient gives a partial sum; a broadcast one is
counted once): the result is the same for every placement and SBP. Contributions of
parameters on other placements are moved to the first parameter's placement.
"""
from __future__ import annotations

import math
from typing import Iterable, Union

import ctensor as ct

__all__ = ["clip_grad_norm_"]


def clip_grad_norm_(parameters: Union[ct.Tensor, Iterable[ct.Tensor]], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False) -> ct.Tensor:
    """Scale the gradients in place so that their joint ``norm_type``-norm is at most
    ``max_norm``; return the norm before clipping (a 0-d tensor, like PyTorch).

    >>> loss.backward()
    >>> total = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    >>> opt.step()
    """
    if isinstance(parameters, ct.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or max_norm < 0:
        raise ValueError(f"clip_grad_norm_: argument 'max_norm' must be a number >= 0, got "
                         f"{max_norm!r}")
    norm_type = float(norm_type)
    if not (norm_type > 0):
        raise ValueError(f"clip_grad_norm_: argument 'norm_type' must be > 0 or inf, got "
                         f"{norm_type!r}")
    if not grads:
        return ct.zeros(())
    home = grads[0].placement
    replicated = (ct.sbp.broadcast,) * home.ndim
    with ct.no_grad():
        parts = []
        for g in grads:
            a = g.abs()
            part = a.amax() if math.isinf(norm_type) else (a ** norm_type).sum()
            parts.append(part.to(grads[0].dtype).to_global(home, replicated))
        total = parts[0]
        for part in parts[1:]:
            total = ct.maximum(total, part) if math.isinf(norm_type) else total + part
        if not math.isinf(norm_type):
            total = total ** (1.0 / norm_type)
        if error_if_nonfinite:
            value = float(total.item())
            if not math.isfinite(value):
                raise ValueError(f"clip_grad_norm_: the total norm of order {norm_type} of the "
                                 f"gradients is non-finite ({value}); pass "
                                 f"error_if_nonfinite=False to clip anyway")
        coef = ct.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            scale = coef.to_global(g.placement, (ct.sbp.broadcast,) * g.placement.ndim)
            g.copy_(g * scale.to(g.dtype))
    return total
