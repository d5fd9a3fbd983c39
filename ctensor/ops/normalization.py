"""``layer_norm``: normalisation over the trailing dims, then an optional affine map.

The normalisation and its affine map (``weight``, ``bias``) are one op with two ways to
run, chosen by cost per layout:

* the fused kernel (one pass forward; one backward through ``layer_norm.grad`` or, with a
  weight, ``layer_norm.grad_affine``, which gives the input's gradient and the weight's and
  bias's partial sums at once) when no normalised dim is split: B,B,B->B and
  S(e),B,B->S(e) for e before the normalised dims; its grads also P,..->P (linear in the
  incoming gradient). The backward keeps the input and the weight only (the normalised
  input is computed again from them), as Megatron-LM's fused LayerNorm does;
* the composite for a split normalised dim (weight and bias split alike): partial means
  (two small all-reduces of row statistics), the input is never gathered.
"""
from __future__ import annotations

import numpy as np

from ..dispatch import as_tensor
from ..registry import OPS
from ._rules import B, P, S, defop, reduced, row_stats_comm, sig, widen, widened


def _normalize(xp, x, ndims, eps):
    axes = tuple(range(x.ndim - ndims, x.ndim))
    mean = xp.mean(x, axis=axes, keepdims=True)
    xc = x - mean
    rstd = 1.0 / xp.sqrt(xp.mean(xc * xc, axis=axes, keepdims=True) + eps)
    xc *= rstd  # (in place: the same bits as xc * rstd, one array fewer)
    return xc, rstd, axes


def _affine(y, affine: tuple):
    """``y * weight (+ bias)`` (arrays in the kernel, tensors in the composite)."""
    if affine:
        y = y * affine[0]
        if len(affine) > 1:
            y = y + affine[1]
    return y


def _kernel(xp, x, *affine, ndims, eps):
    if x.size == 0:
        return x.copy()
    x = widen(xp, x)  # float16: mean and variance in float32
    return _affine(_normalize(xp, x, ndims, eps)[0], affine)


def _input_grad(xp, g, xhat, rstd, axes, own: bool = False):
    """d/dx of (x - mean) * rstd: rstd * (g - mean(g) - xhat * mean(g * xhat)), computed in
    place in ``g`` when ``own`` (a temporary of the caller's) and in ``xhat`` (the same bits
    as the expression: each step is the same operation on the same operands)."""
    m2 = xp.mean(g * xhat, axis=axes, keepdims=True)
    dx = g - xp.mean(g, axis=axes, keepdims=True) if not own else \
        xp.subtract(g, xp.mean(g, axis=axes, keepdims=True), out=g)
    xhat *= m2
    dx -= xhat
    dx *= rstd
    return dx


def _grad_kernel(xp, g, x, ndims, eps):
    if x.size == 0:
        return g.copy()
    g, x = widen(xp, g, x)
    xhat, rstd, axes = _normalize(xp, x, ndims, eps)
    return _input_grad(xp, g, xhat, rstd, axes)


def _affine_grad_kernel(xp, g, x, w, ndims, eps):
    """The gradients of ``xhat * w (+ b)``: the input's (the normalisation's gradient of
    ``g * w``), and the weight's and bias's sums over this shard's rows."""
    rows = tuple(range(x.ndim - ndims))
    if x.size == 0:
        zero = xp.zeros(w.shape, dtype=w.dtype)
        return g.copy(), zero, zero.copy()
    g, x = widen(xp, g, x)
    xhat, rstd, axes = _normalize(xp, x, ndims, eps)
    dw, db = xp.sum(g * xhat, axis=rows), xp.sum(g, axis=rows)
    return _input_grad(xp, g * w, xhat, rstd, axes, own=True), dw, db


def _trailing(x, attrs) -> tuple:
    return tuple(range(x.ndim - attrs["ndims"], x.ndim))


_comm = row_stats_comm(2, _trailing)  # the mean and the variance


def _meta(layouts, **_):
    """The input's shape; the dtype the affine map promotes to."""
    x = layouts[0]
    if x.dtype.kind not in "fc":
        raise TypeError(f"layer_norm: the input must be a floating tensor, got {x.dtype}; "
                        f"convert it with .float()")
    return [(tuple(x.shape), np.result_type(*[l.dtype for l in layouts]))]


def _signatures(layouts, ndims, **_):
    """The forward: the fused kernel on unsplit normalised dims (weight and bias whole), or
    the composite on a split one (weight and bias split alike)."""
    n, ndim = len(layouts), layouts[0].ndim
    rows = ndim - ndims
    cands = [sig([B] * n, B)] + [sig([S(e)] + [B] * (n - 1), S(e)) for e in range(rows)]
    cands += [sig([S(d)] + [S(d - rows)] * (n - 1), S(d), composite=True, comm=_comm)
              for d in range(rows, ndim)]
    return cands


def _grad_signatures(layouts, ndims, **_):
    """``(g, x[, w])``: rows split alike (the weight's and bias's sums partial), or all
    whole; linear in ``g``, so a partial ``g`` gives partial gradients."""
    n, ndim = len(layouts), layouts[0].ndim
    outs = 1 if n == 2 else 3
    rest = [B] * (n - 2)
    cands = [sig([B] * n, (B,) * outs if outs > 1 else B)]
    cands += [sig([S(e), S(e)] + rest, (S(e), P, P) if outs > 1 else S(e))
              for e in range(ndim - ndims)]
    cands.append(sig([P, B] + rest, (P,) * outs if outs > 1 else P))
    return cands


@widened
def _composite(x, *affine, ndims, eps):
    """The normalisation from partial means: a split normalised dim stays split."""
    dims = tuple(range(x.ndim - ndims, x.ndim))
    xc = x - reduced(OPS.mean(x, dim=dims, keepdim=True))
    var = reduced(OPS.mean(xc * xc, dim=dims, keepdim=True))
    return _affine(xc * OPS.rsqrt(var + eps), affine)


def _backward(ctx, g):
    x = ctx.inputs[0]
    if len(ctx.inputs) == 1:
        return (ctx.op.grads["grad"](g, x, **ctx.attrs),)
    dx, dw, db = ctx.op.grads["grad_affine"](g, x, ctx.inputs[1], **ctx.attrs)
    return (dx, dw, db)[:len(ctx.inputs)]


@defop(kernel=_kernel, meta=_meta, signatures=_signatures, composite=_composite,
       backward=_backward, saves=(0, 1))
def layer_norm(op, x, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """Normalise over the last ``len(normalized_shape)`` dims (biased variance), then scale
    by ``weight`` and shift by ``bias`` (optional, of ``normalized_shape``).

    One fused kernel when no normalised dim is split (other splits stay local); a split
    normalised dim goes through partial means (two small all-reduces of row statistics).
    The backward keeps the input and the weight, not the normalised input.

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
    if weight is None:  # (a bias alone is added after)
        y = op(x, ndims=n, eps=float(eps))
        return y if bias is None else y + bias
    affine = (weight,) if bias is None else (weight, bias)
    return op(x, *affine, ndims=n, eps=float(eps))


def _grad_meta(layouts, **_):
    g, x = layouts[0], layouts[1]
    out = [(tuple(g.shape), np.result_type(g.dtype, x.dtype))]
    if len(layouts) == 3:
        w = layouts[2]
        out += [(tuple(w.shape), np.result_type(g.dtype, w.dtype))] * 2
    return out


layer_norm.op.grad_kernel("grad", _grad_kernel, meta=_grad_meta, signatures=_grad_signatures)
layer_norm.op.grad_kernel("grad_affine", _affine_grad_kernel, meta=_grad_meta,
                          signatures=_grad_signatures, n_outputs=3)
