"""Reductions: sum, mean, amax/amin (and max/min), argmax/argmin.

Signatures (1-D) for a reduction over dims D:

* B -> B;
* S(e), e not in D -> S(e') (e' = e shifted left by the reduced dims before it, unless
  keepdim);
* S(d), d in D -> P for sum/mean (the local sums add up: sum_r sum(x_r) = sum(X); mean
  divides each local sum by the *global* count), P(max)/P(min) for amax/amin;
* P -> P for sum/mean (linear), P(max) -> P(max) for amax (max of maxes), P(min) likewise.

argmax/argmin need the values and positions together, so they accept B and S(e), e != d;
a split along the reduced dim is boxed first.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..dispatch import defop
from ..registry import OPS
from ..runtime import get_default_dtype
from ..sbp import ReduceOp
from ..tensor import Tensor
from ._rules import B, P, PMAX, PMIN, S, norm_dim, sig


def _dims(opname: str, dim, ndim: int) -> tuple:
    if type(dim) is int and 0 <= dim < ndim:  # the common case, checked cheaply
        return (dim,)
    if dim is None:
        return tuple(range(ndim))
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    out = tuple(sorted({norm_dim(opname, d, ndim) for d in dims})) if ndim else ()
    if len(out) != len(dims):
        raise ValueError(f"{opname}: argument 'dim' {dim} names a dim twice")
    return out


def _out_shape(shape: tuple, dims: tuple, keepdim: bool) -> tuple:
    if keepdim:
        return tuple(1 if i in dims else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in dims)


def _shift(e: int, dims: tuple, keepdim: bool) -> int:
    return e if keepdim else e - sum(1 for d in dims if d < e)


def _reduce_signatures(partial_out, partial_in):
    def signatures(layouts, dims, keepdim, **_):
        (x,) = layouts
        cands = [sig([B], B)]
        for e in range(x.ndim):
            if e in dims:
                if partial_out is not None:
                    cands.append(sig([S(e)], partial_out))
            else:
                cands.append(sig([S(e)], S(_shift(e, dims, keepdim))))
        if partial_in is not None:
            cands.append(sig([partial_in], partial_in))
        return cands
    return signatures


def _reduce_meta(kind):
    def meta(layouts, dims, keepdim, **_):
        (x,) = layouts
        dtype = x.dtype
        if kind == "mean" and dtype.kind not in "fc":
            dtype = get_default_dtype()
        elif kind == "sum" and dtype.kind == "b":
            dtype = np.dtype(np.int64)
        elif kind == "index":
            dtype = np.dtype(np.int64)
        return [(_out_shape(x.shape, dims, keepdim), dtype)]
    return meta


# ----------------------------------------------------------------------------- expand back
def _unreduce_kernel(xp, g, dims, keepdim, shape, ctx):
    """Broadcast a reduced gradient back over the reduced dims (local region of ``shape``)."""
    if not keepdim and dims:
        g = xp.expand_dims(g, dims)
    local = tuple(b - a for a, b in ctx.out_region(0))
    return xp.broadcast_to(g, local).copy()


def _unreduce_signatures(layouts, dims, keepdim, shape, **_):
    # the transposes of the reduction's rules: a kept dim's split maps back; a replicated
    # gradient fills any split of a reduced dim locally (each shard broadcasts into its part)
    cands = [sig([B], B), sig([P], P)]
    kept = [e for e in range(len(shape)) if e not in dims]
    for e in kept:
        cands.append(sig([S(_shift(e, dims, keepdim))], S(e)))
    cands += [sig([B], S(d)) for d in dims]
    return cands


def unreduce(g, dims: tuple, keepdim: bool, shape: tuple):
    """The inverse shape of a reduction: ``g`` (reduced over ``dims`` of an input of
    ``shape``) broadcast back to ``shape``. A gradient kernel of ``sum`` (declared below);
    the backwards of every reduction, and matmul's for 1-D operands, use it."""
    return sum_.op.grads["unreduce"](g, dims=tuple(dims), keepdim=bool(keepdim),
                                     shape=tuple(shape))


def _check(opname, x):
    if not isinstance(x, Tensor):
        raise TypeError(f"{opname}: expected a ct.Tensor, got {type(x).__name__}")


# ----------------------------------------------------------------------------- sum / mean
@defop("sum", kernel=lambda xp, x, dims, keepdim: xp.sum(x, axis=dims, keepdims=keepdim),
       meta=_reduce_meta("sum"), signatures=_reduce_signatures(P, P),
       backward=lambda ctx, g: (unreduce(g, ctx.attrs["dims"], ctx.attrs["keepdim"],
                                         ctx.inputs[0].shape),),
       method=True)
def sum_(op, x, dim=None, keepdim: bool = False):
    """Sum over ``dim`` (an int, a tuple, or None for all dims)."""
    _check("sum", x)
    return op(x, dims=_dims("sum", dim, x.ndim), keepdim=bool(keepdim))


sum_.op.grad_kernel(
    "unreduce", _unreduce_kernel, needs_ctx=True,
    meta=lambda layouts, dims, keepdim, shape: [(tuple(shape), layouts[0].dtype)],
    signatures=_unreduce_signatures,
    backward=lambda ctx, g: (OPS.sum(g, dim=ctx.attrs["dims"], keepdim=ctx.attrs["keepdim"]),))


def _mean_kernel(xp, x, dims, keepdim, count):
    out = xp.sum(x, axis=dims, keepdims=keepdim)
    return out / count if count else out * np.nan


@defop(kernel=_mean_kernel, meta=_reduce_meta("mean"), signatures=_reduce_signatures(P, P),
       backward=lambda ctx, g: (unreduce(g / max(ctx.attrs["count"], 1), ctx.attrs["dims"],
                                         ctx.attrs["keepdim"], ctx.inputs[0].shape),),
       method=True)
def mean(op, x, dim=None, keepdim: bool = False):
    """Mean over ``dim`` (an int, a tuple, or None for all dims)."""
    _check("mean", x)
    dims = _dims("mean", dim, x.ndim)
    count = int(np.prod([x.shape[d] for d in dims], dtype=np.int64))
    return op(x, dims=dims, keepdim=bool(keepdim), count=count)


# ----------------------------------------------------------------------------- max / min
def _extreme_bw(ctx, g):
    (x,), (out,) = ctx.inputs, ctx.outputs
    dims, keepdim = ctx.attrs["dims"], ctx.attrs["keepdim"]
    hit = (x == unreduce(out, dims, keepdim, x.shape)).to(g.dtype)
    count = unreduce(OPS.sum(hit, dim=dims, keepdim=keepdim), dims, keepdim, x.shape)
    return (unreduce(g, dims, keepdim, x.shape) * hit / count,)


def _extreme_kernel(fn: str, reduce_op: ReduceOp):
    def kernel(xp, x, dims, keepdim):
        if x.size:
            return getattr(xp, fn)(x, axis=dims, keepdims=keepdim)
        return xp.full(_out_shape(x.shape, dims, keepdim), reduce_op.identity(x.dtype),
                       x.dtype)
    return kernel


@defop(kernel=_extreme_kernel("max", ReduceOp.MAX), meta=_reduce_meta("same"),
       signatures=_reduce_signatures(PMAX, PMAX), backward=_extreme_bw, method=True)
def amax(op, x, dim=None, keepdim: bool = False):
    """Largest value over ``dim`` (int, tuple or None); ties share the gradient."""
    _check("amax", x)
    return op(x, dims=_dims("amax", dim, x.ndim), keepdim=bool(keepdim))


@defop(kernel=_extreme_kernel("min", ReduceOp.MIN), meta=_reduce_meta("same"),
       signatures=_reduce_signatures(PMIN, PMIN), backward=_extreme_bw, method=True)
def amin(op, x, dim=None, keepdim: bool = False):
    """Smallest value over ``dim`` (int, tuple or None); ties share the gradient."""
    _check("amin", x)
    return op(x, dims=_dims("amin", dim, x.ndim), keepdim=bool(keepdim))


def _arg_signatures(layouts, dims, keepdim, **_):
    (x,) = layouts
    return [sig([B], B)] + [sig([S(e)], S(_shift(e, dims, keepdim)))
                            for e in range(x.ndim) if e not in dims]


def _arg_kernel(fn):
    def kernel(xp, x, dims, keepdim):
        if not dims:  # over a 0-d tensor
            return xp.zeros(x.shape, dtype=np.int64)
        if len(dims) == x.ndim and x.ndim > 1:
            flat = getattr(xp, fn)(x.reshape(-1))
            return flat.reshape((1,) * x.ndim) if keepdim else flat
        return getattr(xp, fn)(x, axis=dims[0], keepdims=keepdim)
    return kernel


@defop(kernel=_arg_kernel("argmax"), meta=_reduce_meta("index"), signatures=_arg_signatures,
       method=True)
def argmax(op, x, dim: Optional[int] = None, keepdim: bool = False):
    """Index of the largest value along ``dim`` (of the flattened tensor if None)."""
    _check("argmax", x)
    return op(x, dims=_dims("argmax", dim, x.ndim), keepdim=bool(keepdim))


@defop(kernel=_arg_kernel("argmin"), meta=_reduce_meta("index"), signatures=_arg_signatures,
       method=True)
def argmin(op, x, dim: Optional[int] = None, keepdim: bool = False):
    """Index of the smallest value along ``dim`` (of the flattened tensor if None)."""
    _check("argmin", x)
    return op(x, dims=_dims("argmin", dim, x.ndim), keepdim=bool(keepdim))


def _max_or_min(name, extreme, arg):
    def front(x, dim=None, keepdim: bool = False):
        if dim is None:
            return extreme(x)
        return extreme(x, dim, keepdim), arg(x, dim, keepdim)
    front.__name__ = name
    front.__doc__ = (f"``x.{name}()`` is the {name} of all elements; ``x.{name}(dim)`` "
                     f"returns ``(values, indices)`` like PyTorch.")
    return defop(name, method=True)(front)


max_ = _max_or_min("max", amax, argmax)
min_ = _max_or_min("min", amin, argmin)
