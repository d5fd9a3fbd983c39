"""Scans: ``cumsum`` along one dim.

Signatures (1-D): B -> B; S(e) -> S(e) for e != dim; P -> P (a cumulative sum is linear:
the sum over ranks of the local scans is the scan of the sum). A split along ``dim`` itself
is not offered, so boxing gathers that dim first: each element needs the totals of every
part before it, which live on other ranks (correct first; a scan of the shard totals across
ranks could serve that split without gathering, later).

The backward of a cumulative sum is the reversed cumulative sum of the gradient (``g_i =
sum_{j >= i} G_j``): the same op with its internal ``reverse`` attribute set.
"""
from __future__ import annotations

import numpy as np

from ..dispatch import as_tensor
from ..dtypes import reduction_dtype
from ._rules import B, P, S, defop, norm_dim, sig
from .shape import partial_signatures

__all__ = ["cumsum"]


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
def cumsum(op, x, dim: int):
    """Cumulative sum along ``dim``; bool and integer tensors sum in int64. A split along
    ``dim`` is gathered first (boxing); splits of other dims stay local.

    >>> x.cumsum(1); ct.cumsum(x, dim=0)
    """
    (x,) = as_tensor([x], "cumsum")
    d = norm_dim("cumsum", dim, x.ndim)
    if x.ndim == 0:
        return op(x.reshape(1), dim=0, reverse=False).reshape(())
    return op(x, dim=d, reverse=False)
