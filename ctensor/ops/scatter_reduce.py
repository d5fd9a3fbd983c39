"""``scatter_reduce(input, dim, index, src, reduce, include_self=True)`` (PyTorch's): the
entries of ``src`` combined into ``input`` along ``dim`` at ``index`` with ``"sum"``,
``"prod"``, ``"mean"``, ``"amax"`` or ``"amin"``; with ``include_self=False`` a position
that receives values forgets its own first. Index rules as :func:`ct.scatter`'s.

Signatures (1-D, per mesh axis), ``x, index, src -> out`` (the kernel is scatter's masked
local write, so every position's contributions are on the rank that holds it):

================================ ==========================================================
 B, B, B -> B; S(dim), B, B ->    every reduction (a position and all it receives are on
 S(dim); S(e), S(e), S(e) ->      one rank; e != dim where x and index are alike along e)
 S(e)
 P, B, P -> P                     ``sum`` (linear in x and src together)
 P, S(e), S(e) -> P               ``sum`` with ``include_self``: each rank adds its own part
                                  (e == dim, or x and index unlike along e)
================================ ==========================================================

Gradients (PyTorch's): ``sum`` as scatter_add's; ``mean`` shares each position's gradient
among the values averaged there; ``amax`` / ``amin`` among the values equal to the result
(ties evenly, the input's own value included when it counts); ``prod`` has none here (a
``RuntimeError`` in the backward: use ``log``-sums or ``reduce="sum"``).
"""
from __future__ import annotations

import numpy as np

from ..dispatch import as_tensor
from ..registry import OPS
from ..tensor import Tensor
from ._rules import defop, norm_dim
from .embedding import check_int
from .embedding import index_add as add_at
from .scatter import (multiply_at, scatter_signatures, scatter_targets, scratch_result,
                      scratch_target)

__all__ = ["scatter_reduce"]  # (scatter_reduce_ is in inplace.py, with the other in-place ops)

_REDUCES = ("sum", "prod", "mean", "amax", "amin")


def _identity(dtype, reduce: str):
    """The value a position that forgets its own starts from."""
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dtype.kind == "b":
        return reduce == "amin"
    if dtype.kind in "fc":
        return -np.inf if reduce == "amax" else np.inf
    info = np.iinfo(dtype)
    return info.min if reduce == "amax" else info.max


def _meta(layouts, dim, reduce, include_self):
    x, index, _ = layouts
    check_int("scatter_reduce", "index", index)
    return [(tuple(x.shape), x.dtype)]


def _signatures(layouts, dim, reduce, include_self):
    x, index, _ = layouts
    return scatter_signatures(x, index, dim, partial=reduce == "sum",
                              adds=reduce == "sum" and include_self)


def _kernel(xp, x, index, src, dim, reduce, include_self, ctx):
    out = x.copy()
    if index.size == 0 or out.size == 0:
        return out
    where, inside = scatter_targets(xp, "scatter_reduce", index, dim, ctx)
    target, values_of = scratch_target(xp, out, inside)
    values = values_of(src)
    if not include_self:
        target[where] = _identity(out.dtype, reduce)
    if reduce in ("sum", "mean"):
        add_at(xp, target, where, values)
    elif reduce == "prod":
        multiply_at(xp, target, where, values)
    else:
        ufunc = xp.maximum if reduce == "amax" else xp.minimum
        ufunc.at(target, where, values)
    if reduce == "mean":  # (where, not a boolean mask: no host synchronisation on a GPU)
        count = xp.zeros(target.shape, dtype=np.int64)
        add_at(xp, count, where, xp.ones(values.shape, dtype=np.int64))
        touched = count > 0
        count = xp.maximum(count + (1 if include_self else 0), 1)
        if out.dtype.kind == "f":
            mean = target / count
        else:  # PyTorch: integer means round down
            mean = target // count
        target = xp.where(touched, mean.astype(out.dtype), target)
    return scratch_result(out, target)


def _backward(ctx, g):
    dim, reduce, keep = ctx.attrs["dim"], ctx.attrs["reduce"], ctx.attrs["include_self"]
    x, index, src = ctx.inputs
    if reduce == "prod":
        raise RuntimeError("scatter_reduce: the gradient of reduce='prod' is not implemented; "
                           "use reduce='sum' of logarithms, or detach the inputs")
    zero = OPS.to(as_tensor([g, 0.0], "scatter_reduce")[1], g.dtype)
    one = OPS.to(as_tensor([g, 1.0], "scatter_reduce")[1], g.dtype)
    ones = OPS.expand(one, *index.shape)
    # how many values each position received (itself not counted)
    received = OPS.scatter_add(OPS.expand(zero, *g.shape), dim, index, ones)
    touched = OPS.gt(received, 0.0)
    if reduce == "sum":
        g_x = g if keep else OPS.where(touched, zero, g)
        return g_x, None, OPS.gather(g, dim, index)
    if reduce == "mean":
        count = received + 1.0 if keep else OPS.where(touched, received, one)
        share = g / count
        g_x = share if keep else OPS.where(touched, zero, g)
        return g_x, None, OPS.gather(share, dim, index)
    # amax / amin: the gradient shared evenly among the values equal to the result
    (out,) = ctx.outputs
    src_hit = OPS.to(OPS.eq(src, OPS.gather(out, dim, index)), g.dtype)
    self_hit = OPS.to(OPS.eq(x, out), g.dtype)
    if not keep:  # a position that received values forgot its own
        self_hit = OPS.where(touched, zero, self_hit)
    ties = OPS.scatter_add(self_hit, dim, index, src_hit)
    share = g / OPS.where(OPS.gt(ties, 0.0), ties, one)
    return share * self_hit, None, OPS.gather(share, dim, index) * src_hit


@defop(kernel=_kernel, meta=_meta, signatures=_signatures, needs_ctx=True,
       backward=_backward, method=True)
def scatter_reduce(op, input, dim: int, index, src, reduce: str, *,  # noqa: A002
                   include_self: bool = True):
    """``input`` with ``src`` combined in along ``dim`` at ``index`` by ``reduce`` (``"sum"``,
    ``"prod"``, ``"mean"``, ``"amax"``, ``"amin"``); PyTorch's ``torch.scatter_reduce``.

    >>> per_class_max = ct.full((3,), -1e9, placement=p).scatter_reduce(
    ...     0, labels, scores, "amax", include_self=False)
    """
    if not isinstance(input, Tensor) or not isinstance(src, Tensor):
        raise TypeError(f"scatter_reduce: arguments 'input' and 'src' must be ct.Tensors, got "
                        f"{type(input).__name__} and {type(src).__name__}")
    if reduce not in _REDUCES:
        raise ValueError(f"scatter_reduce: argument 'reduce' is {reduce!r}; accepted: "
                         f"{', '.join(repr(r) for r in _REDUCES)}")
    x, index, src = as_tensor([input, index, src], "scatter_reduce")
    if not isinstance(index, Tensor) or index.dtype.kind not in "iu":
        raise TypeError(f"scatter_reduce: argument 'index' must be an integer tensor, got "
                        f"{getattr(index, 'dtype', type(index).__name__)}")
    if index.ndim != x.ndim or src.ndim != x.ndim:
        raise ValueError(f"scatter_reduce: 'input' {tuple(x.shape)}, 'index' "
                         f"{tuple(index.shape)} and 'src' {tuple(src.shape)} must have the same "
                         f"number of dims")
    if x.ndim == 0:
        return scatter_reduce(x.reshape(1), 0, index.reshape(1), src.reshape(1), reduce,
                              include_self=include_self).reshape(())
    d = norm_dim("scatter_reduce", dim, x.ndim)
    for e in range(x.ndim):
        if index.shape[e] > src.shape[e] or (e != d and index.shape[e] > x.shape[e]):
            raise ValueError(f"scatter_reduce: argument 'index' of shape {tuple(index.shape)} "
                             f"is larger than 'src' {tuple(src.shape)} or, outside dim {d}, "
                             f"than 'input' {tuple(x.shape)} along dim {e}")
    if tuple(src.shape) != tuple(index.shape):
        src = OPS.getitem(src, tuple(slice(0, n) for n in index.shape))
    if src.dtype != x.dtype:
        src = OPS.to(src, x.dtype)
    return op(x, index, src, dim=d, reduce=reduce, include_self=bool(include_self))
