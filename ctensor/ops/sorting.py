"""Sorting: ``argsort``, ``sort`` and ``topk`` along one dim.

The kernels compute indices only (a stable sort: ties keep their order, descending too);
the values are ``gather(x, dim, indices)``, so their gradient is gather's scatter-add and
goes to exactly the elements returned.

Signatures (1-D): B -> B and S(e) -> S(e) for e != dim. A split along ``dim`` is gathered
first (an element's rank depends on the whole dim), and so is a partial input (sorting is
not linear).
"""
from __future__ import annotations

import operator

import numpy as np

from ..dispatch import as_tensor
from ..dtypes import reduction_dtype
from ..registry import OPS
from ._rules import B, S, ValuesIndices, defop, norm_dim, sig

__all__ = ["argsort", "sort", "topk"]


def stable_argsort(xp, x, dim: int, descending: bool = False):
    """Indices that sort ``x`` along ``dim``, ties in their original order. Descending:
    ``n - 1 - flip(argsort(flip(x)))`` (ties stay in order; NaN first, as the largest)."""
    kind = {"kind": "stable"} if xp is np else {}  # CuPy's sort is always stable
    if not descending:
        return xp.argsort(x, axis=dim, **kind)
    flipped = xp.argsort(xp.flip(x, axis=dim), axis=dim, **kind)
    return (x.shape[dim] - 1) - xp.flip(flipped, axis=dim)


def _signatures(layouts, dim, **_):
    (x,) = layouts
    return [sig([B], B)] + [sig([S(e)], S(e)) for e in range(x.ndim) if e != dim]


def _meta(layouts, dim, k=None, **_):
    (x,) = layouts
    shape = list(x.shape)
    if k is not None:
        shape[dim] = k
    return [(tuple(shape), reduction_dtype("argsort", x.dtype))]


def _input(opname: str, x, dim):
    (x,) = as_tensor([x], opname)
    if x.dtype.kind == "c":
        raise TypeError(f"{opname}: complex tensors cannot be ordered, got {x.dtype}")
    return x, norm_dim(opname, dim, x.ndim)


def _on_1d(fn, x, *args):
    """``fn`` on a 0-d ``x`` seen as one element (PyTorch accepts 0-d inputs)."""
    out = fn(x.reshape(1), 0, *args)
    if isinstance(out, tuple):
        return type(out)(*[o.reshape(()) if o.numel() == 1 else o for o in out])
    return out.reshape(())


@defop(kernel=lambda xp, x, dim, descending: stable_argsort(xp, x, dim, descending),
       meta=_meta, signatures=_signatures, method=True)
def argsort(op, x, dim: int = -1, descending: bool = False, stable: bool = False):
    """Indices that sort ``x`` along ``dim`` (int64); the sort is always stable, so
    ``stable`` is accepted for PyTorch code and changes nothing.

    >>> ct.argsort(x, dim=1, descending=True)
    """
    x, d = _input("argsort", x, dim)
    if x.ndim == 0:
        return _on_1d(lambda y, d, desc: argsort(y, d, desc), x, descending)
    return op(x, dim=d, descending=bool(descending))


@defop(method=True)
def sort(x, dim: int = -1, descending: bool = False, stable: bool = False):
    """``(values, indices)`` sorted along ``dim`` (stable); the values are a gather of
    ``x`` at the indices, so their gradient goes back to the element each came from.

    >>> values, indices = x.sort(dim=-1, descending=True)
    """
    x, d = _input("sort", x, dim)
    if x.ndim == 0:
        return _on_1d(lambda y, d, desc: sort(y, d, desc), x, descending)
    indices = argsort(x, d, descending)
    return ValuesIndices(OPS.gather(x, d, indices), indices)


def _topk_kernel(xp, x, k, dim, largest):
    order = stable_argsort(xp, x, dim, descending=largest)
    return order[(slice(None),) * dim + (slice(0, k),)]


@defop(kernel=_topk_kernel, meta=_meta, signatures=_signatures, method=True)
def topk(op, x, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):  # noqa: A002
    """The ``k`` largest (``largest=False``: smallest) elements along ``dim`` as
    ``(values, indices)``, in sorted order (also when ``sorted=False``, whose order PyTorch
    leaves unspecified); ties keep their original order. ``ValueError`` unless
    ``0 <= k <= x.shape[dim]``.

    >>> values, indices = logits.topk(5)
    """
    x, d = _input("topk", x, dim)
    if isinstance(k, bool):
        raise TypeError(f"topk: argument 'k' must be an int, got {k!r}")
    try:
        k = operator.index(k)
    except TypeError:
        raise TypeError(f"topk: argument 'k' must be an int, got {k!r} "
                        f"({type(k).__name__})") from None
    size = x.shape[d] if x.ndim else 1
    if not 0 <= k <= size:
        raise ValueError(f"topk: argument 'k' is {k} but dim {d} of the input of shape "
                         f"{tuple(x.shape)} has {size} elements; accepted: 0..{size}")
    if x.ndim == 0:
        return _on_1d(lambda y, d, k, lg: topk(y, k, d, lg), x, k, largest)
    indices = op(x, k=k, dim=d, largest=bool(largest))
    return ValuesIndices(OPS.gather(x, d, indices), indices)
