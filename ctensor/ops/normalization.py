"""``layer_norm``: normalisation over the trailing dims, then an optional affine map.

The normalisation is one op with two ways to run, chosen by cost per layout:

* the fused kernel (one pass forward, one backward through ``layer_norm.grad``) when no
  normalised dim is split: B->B and S(e)->S(e) for e before the normalised dims; its grad
  also P,B->P (linear in the incoming gradient);
* the composite for a split normalised dim: partial means (two small all-reduces of row
  statistics), the input is never gathered.
"""
from __future__ import annotations

import numpy as np

from ..dispatch import as_tensor
from ..registry import OPS
from ._rules import B, P, S, defop, reduced, row_stats_comm, sig, widen, widened
from .softmax import float_meta


def _normalize(xp, x, ndims, eps):
    axes = tuple(range(x.ndim - ndims, x.ndim))
    mean = xp.mean(x, axis=axes, keepdims=True)
    xc = x - mean
    rstd = 1.0 / xp.sqrt(xp.mean(xc * xc, axis=axes, keepdims=True) + eps)
    return xc * rstd, rstd, axes


def _kernel(xp, x, ndims, eps):
    if x.size == 0:
        return x.copy()
    x = widen(xp, x)  # float16: mean and variance in float32
    return _normalize(xp, x, ndims, eps)[0]


def _grad_kernel(xp, g, x, ndims, eps):
    """d/dx of (x - mean) * rstd: rstd * (g - mean(g) - xhat * mean(g * xhat))."""
    if x.size == 0:
        return g.copy()
    g, x = widen(xp, g, x)
    xhat, rstd, axes = _normalize(xp, x, ndims, eps)
    return rstd * (g - xp.mean(g, axis=axes, keepdims=True)
                   - xhat * xp.mean(g * xhat, axis=axes, keepdims=True))


def _trailing(x, attrs) -> tuple:
    return tuple(range(x.ndim - attrs["ndims"], x.ndim))


_comm = row_stats_comm(2, _trailing)  # the mean and the variance


def _signatures(layouts, ndims, **_):
    n, ndim = len(layouts), layouts[0].ndim
    cands = [sig([B] * n, B)] + [sig([S(e)] * n, S(e)) for e in range(ndim - ndims)]
    if n == 2:  # the grad kernel (g, x) is linear in g
        cands.append(sig([P, B], P))
    else:
        cands += [sig([S(d)], S(d), composite=True, comm=_comm)
                  for d in range(ndim - ndims, ndim)]
    return cands


@widened
def _composite(x, ndims, eps):
    """The normalisation from partial means: a split normalised dim stays split."""
    dims = tuple(range(x.ndim - ndims, x.ndim))
    xc = x - reduced(OPS.mean(x, dim=dims, keepdim=True))
    var = reduced(OPS.mean(xc * xc, dim=dims, keepdim=True))
    return xc * OPS.rsqrt(var + eps)


@defop(kernel=_kernel, meta=float_meta("layer_norm"), signatures=_signatures,
       composite=_composite,
       backward=lambda ctx, g: (ctx.op.grads["grad"](g, ctx.inputs[0], **ctx.attrs),))
def layer_norm(op, x, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """Normalise over the last ``len(normalized_shape)`` dims (biased variance), then scale
    by ``weight`` and shift by ``bias`` (optional, of ``normalized_shape``).

    One fused kernel when no normalised dim is split (other splits stay local); a split
    normalised dim goes through partial means (two small all-reduces of row statistics).

    >>> y = ct.layer_norm(x, (64,), gamma, beta)
    """
    (x,) = as_tensor([x], "layer_norm")
    shape = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) \
        else tuple(normalized_shape)
    n = len(shape)
    if n == 0 or n > x.ndim or tuple(x.shape[x.ndim - n:]) != shape:
        raise ValueError(f"layer_norm: argument 'normalized_shape' is {shape} but the input "
                         f"has shape {tuple(x.shape)}; accepted: a non-empty tail of the "
                         f"input's shape")
    if x.dtype.kind not in "fc":
        raise TypeError(f"layer_norm: the input must be a floating tensor, got {x.dtype}")
    for arg, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"layer_norm: argument '{arg}' has shape {tuple(t.shape)}, "
                             f"accepted {shape} (normalized_shape)")
    y = op(x, ndims=n, eps=float(eps))
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


layer_norm.op.grad_kernel("grad", _grad_kernel, meta=float_meta("layer_norm"),
                          signatures=_signatures)
