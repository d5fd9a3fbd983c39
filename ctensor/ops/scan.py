"""Scans: ``cumsum`` and ``cumprod`` along one dim, and ``diff`` written with slices.

Signatures (1-D): B -> B; S(e) -> S(e) for e != dim; P -> P (a cumulative sum is linear:
the sum over ranks of the local scans is the scan of the sum). A split along ``dim`` itself
is not offered, so boxing gathers that dim first: each element needs the totals of every
part before it, which live on other ranks (correct first; a scan of the shard totals across
ranks could serve that split without gathering, later).

The backward of a cumulative sum is the reversed cumulative sum of the gradient (``g_i =
sum_{j >= i} G_j``): the same op with its internal ``reverse`` attribute set.

``cumprod`` has cumsum's signatures without P -> P (a product is not linear); its gradient
kernel ``cumprod.grad`` is exact with zeros present (no division by ``x``):
``dx_i = (prod_{k<i} x_k) * R_i`` with ``R_i = G_i + x_{i+1} R_{i+1}``, one reverse pass.
``diff`` is ``x[1:] - x[:-1]`` along its dim (narrow and sub): a split of another dim stays
local, a split of that dim is boxed by the slices.
"""
from __future__ import annotations

import numpy as np

from ..dispatch import as_tensor
from ..dtypes import reduction_dtype
from ..registry import OPS
from ..tensor import Tensor
from ._rules import B, P, S, defop, norm_dim, sig
from .reduction import in_dtype
from .shape import partial_signatures

__all__ = ["cumsum", "cumprod", "diff"]


def _kernel(xp, x, dim, reverse):
    acc = np.int64 if x.dtype.kind in "biu" else None
    if reverse:
        return xp.flip(xp.cumsum(xp.flip(x, axis=dim), axis=dim, dtype=acc), axis=dim)
    return xp.cumsum(x, axis=dim, dtype=acc)


def _signatures(layouts, dim, reverse):
    (x,) = layouts
    cands = [sig([B], B)] + [sig([S(e)], S(e)) for e in range(x.ndim) if e != dim]
    return cands + partial_signatures(layouts, (P,))


@defop(kernel=_kernel, signatures=_signatures,
       meta=lambda layouts, dim, reverse: [(tuple(layouts[0].shape),
                                            reduction_dtype("cumsum", layouts[0].dtype))],
       backward=lambda ctx, g: (cumsum.op(g, dim=ctx.attrs["dim"],
                                          reverse=not ctx.attrs["reverse"]),),
       method=True)
def cumsum(op, x, dim: int, *, dtype=None):
    """Cumulative sum along ``dim``; bool and integer tensors sum in int64 (``dtype=``: the
    input is cast to it first, as PyTorch). A split along ``dim`` is gathered first
    (boxing); splits of other dims stay local.

    >>> x.cumsum(1); ct.cumsum(x, dim=0); mask.cumsum(-1, dtype=ct.int32)
    """
    (x,) = as_tensor([x], "cumsum")
    if dtype is not None:
        return in_dtype(lambda t: cumsum(t, dim), "cumsum", x, dtype)
    d = norm_dim("cumsum", dim, x.ndim)
    if x.ndim == 0:
        return op(x.reshape(1), dim=0, reverse=False).reshape(())
    return op(x, dim=d, reverse=False)


# ----------------------------------------------------------------------------- cumprod
def _cumprod_kernel(xp, x, dim):
    return xp.cumprod(x, axis=dim, dtype=np.int64 if x.dtype.kind in "biu" else None)


def _cumprod_grad_kernel(xp, g, x, dim):
    """``dx_i = (prod_{k<i} x_k) * R_i``, ``R_i = g_i + x_{i+1} R_{i+1}`` (exact with zeros)."""
    g, x = xp.moveaxis(g, dim, 0), xp.moveaxis(x, dim, 0)
    n = x.shape[0]
    out = xp.empty_like(g)
    if n == 0:
        return xp.moveaxis(out, 0, dim)
    before = xp.ones_like(x)
    if n > 1:
        before[1:] = xp.cumprod(x[:-1], axis=0)
    acc = g[n - 1].copy()
    out[n - 1] = acc
    for i in range(n - 2, -1, -1):
        acc *= x[i + 1]
        acc += g[i]
        out[i] = acc
    out *= before
    return xp.moveaxis(out, 0, dim)


def _cumprod_signatures(layouts, dim):
    (x,) = layouts[-1:]
    n = len(layouts)
    cands = [sig([B] * n, B)] + [sig([S(e)] * n, S(e)) for e in range(x.ndim) if e != dim]
    if n == 2:  # the grad kernel (g, x) is linear in g
        cands.append(sig([P, B], P))
    return cands


@defop(kernel=_cumprod_kernel, signatures=_cumprod_signatures,
       meta=lambda layouts, dim: [(tuple(layouts[0].shape),
                                   reduction_dtype("cumsum", layouts[0].dtype))],
       backward=lambda ctx, g: (ctx.op.grads["grad"](g, ctx.inputs[0], **ctx.attrs),),
       method=True)
def cumprod(op, x, dim: int, *, dtype=None):
    """Cumulative product along ``dim``; bool and integer tensors multiply in int64. A
    split along ``dim`` is gathered first; splits of other dims stay local. The gradient is
    exact with zeros in ``x`` (no division).

    >>> x.cumprod(1); ct.cumprod(x, dim=0); x.cumprod(0, dtype=ct.float64)
    """
    (x,) = as_tensor([x], "cumprod")
    if dtype is not None:
        return in_dtype(lambda t: cumprod(t, dim), "cumprod", x, dtype)
    d = norm_dim("cumprod", dim, x.ndim)
    if x.ndim == 0:
        return op(x.reshape(1), dim=0).reshape(())
    return op(x, dim=d)


cumprod.op.grad_kernel(
    "grad", _cumprod_grad_kernel, signatures=_cumprod_signatures,
    meta=lambda layouts, dim: [(tuple(layouts[1].shape), layouts[0].dtype)])


# ----------------------------------------------------------------------------- diff
@defop(method=True)
def diff(x, n: int = 1, dim: int = -1, prepend=None, append=None):
    """The ``n``-th forward difference along ``dim``: ``x[1:] - x[:-1]`` applied ``n`` times
    (bool tensors: ``x[1:] != x[:-1]``), after ``prepend`` / ``append`` (tensors, same shape
    but along ``dim``) are concatenated on either side (PyTorch's ``diff``).

    >>> x.diff(); ct.diff(x, n=2, dim=0, prepend=x[:1])
    """
    (x,) = as_tensor([x], "diff")
    if x.ndim == 0:
        raise ValueError("diff: the input is 0-d; accepted: tensors with at least one dim")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"diff: argument 'n' is {n!r}; accepted: an int >= 0")
    d = norm_dim("diff", dim, x.ndim)
    for name, extra in (("prepend", prepend), ("append", append)):
        if extra is not None and not isinstance(extra, Tensor):
            raise TypeError(f"diff: argument '{name}' must be a ct.Tensor or None, got "
                            f"{type(extra).__name__}")
    parts = [t for t in (prepend, x, append) if t is not None]
    if len(parts) > 1:
        x = OPS.cat(parts, d)
    for _ in range(int(n)):
        size = x.shape[d]
        if size == 0:
            break
        later, earlier = OPS.narrow(x, d, 1, size - 1), OPS.narrow(x, d, 0, size - 1)
        x = later != earlier if x.dtype == np.dtype(bool) else later - earlier
    return x
