"""``gather(x, dim, index)`` (PyTorch's) and its gradient, a scatter-add.

``out[i][j][k] = x[i][index[i][j][k]][k]`` for ``dim == 1``; ``index`` has ``x``'s number
of dims, is no larger than ``x`` outside ``dim``, and ``out`` has its shape. One kernel
serves every signature: it reads the logical regions of its shards (dispatch context),
slices ``x`` to the index's region outside ``dim``, and along ``dim`` picks only the
indices inside its own part of ``x``, writing zeros elsewhere.

Signatures (1-D), ``e != dim``:

================================ ==========================================================
 x, index -> out                  why
================================ ==========================================================
 B, B -> B                        every rank gathers everything
 S(e), S(e) -> S(e)               rows of x and index travel together (only when x and
                                  index have the same size along e, so their parts match)
 B, S(e) -> S(e)                  each rank gathers its rows of index from the whole x (when
                                  index is smaller than x along e, and for e == dim)
 S(dim), B -> P                   each rank picks the indices inside its part of dim, zeros
                                  elsewhere: the sum over ranks is the gather (embedding's
                                  vocabulary-split rule); not for bool x
 P, B -> P                        gather is linear in x
================================ ==========================================================

A split of x outside ``dim`` where index is smaller, or of x along a dim index is split on
differently, is not offered: the parts of x and index would not line up, so boxing gathers
one of them. The gradient ``gather.scatter_add(g, index, x)`` adds ``g`` into zeros shaped
like ``x`` at ``index``; ``x`` is passed for its layout only, and its signatures are the
transposes of the forward's (gather is linear in x), so the gradient comes out in x's layout.
"""
from __future__ import annotations

from ..arrays import is_host
from ..dispatch import as_tensor
from ..tensor import Tensor
from ._rules import B, P, S, defop, norm_dim, sig, transposed_signatures
from ._checks import check_range
from .embedding import check_int, index_add

__all__ = ["gather"]


def _meta(layouts, dim):
    x, index = layouts
    check_int("gather", "index", index)
    return [(tuple(index.shape), x.dtype)]


def _signatures(layouts, dim):
    x, index = layouts
    cands = [sig([B, B], B)]
    for e in range(x.ndim):
        if e != dim and x.shape[e] == index.shape[e]:
            cands.append(sig([S(e), S(e)], S(e)))
        else:
            cands.append(sig([B, S(e)], S(e)))
    if x.dtype.kind != "b":  # a partial sum of bools is not their value
        cands += [sig([S(dim), B], P), sig([P, B], P)]
    return cands


def _check_range(xp, index, size: int) -> None:
    check_range(xp, "gather", index, size, lambda a, b: f"gather: argument 'index' must hold "
                f"values in [0, {size}), got values in [{a}, {b}]")


def _offsets(index_region, x_region, dim: int) -> tuple:
    """The slice of an ``x`` shard (``x_region``) under an index shard (``index_region``)
    outside ``dim``: the signatures guarantee the one lies inside the other."""
    return tuple(slice(None) if e == dim else slice(ia - xa, ib - xa)
                 for e, ((xa, _), (ia, ib)) in enumerate(zip(x_region, index_region)))


def _kernel(xp, x, index, dim, ctx):
    size = ctx.in_layouts[0].shape[dim]
    _check_range(xp, index, size)
    lo, hi = ctx.in_region(0)[dim]
    xs = x[_offsets(ctx.in_region(1), ctx.in_region(0), dim)]
    if hi - lo == size:  # (on a device bad ids raise later: clipped, never read out of bounds)
        safe = index if is_host(index) else xp.clip(index, 0, size - 1)
        return xp.take_along_axis(xs, safe, axis=dim)
    if hi == lo or index.size == 0:
        return xp.zeros(index.shape, dtype=x.dtype)
    local = index - lo
    inside = (local >= 0) & (local < hi - lo)
    picked = xp.take_along_axis(xs, xp.where(inside, local, 0), axis=dim)
    return xp.where(inside, picked, xp.zeros((), dtype=x.dtype))


def _scatter_add_kernel(xp, g, index, x, dim, ctx):
    region = ctx.out_region(0)
    out = xp.zeros(tuple(b - a for a, b in region), dtype=g.dtype)
    if index.size == 0:
        return out
    block = out[_offsets(ctx.in_region(1), region, dim)]  # a view: writes land in out
    lo, hi = region[dim]
    local = index - lo
    inside = (local >= 0) & (local < hi - lo)
    if hi == lo:
        return out
    # every entry adds, those outside this shard a zero into position 0 (no boolean-mask
    # indexing: a data-dependent shape, a host synchronisation on a GPU)
    coords = []
    for a in range(index.ndim):
        if a == dim:
            coords.append(xp.where(inside, local, 0))
            continue
        shape = [1] * index.ndim
        shape[a] = index.shape[a]
        positions = xp.arange(index.shape[a]).reshape(shape)
        coords.append(xp.broadcast_to(positions, index.shape))
    index_add(xp, block, tuple(coords), xp.where(inside, g, xp.zeros((), g.dtype)))
    return out


def _scatter_add_signatures(layouts, dim):
    g, index, x = layouts
    return transposed_signatures(_signatures((x, index), dim), wrt=0, order=("g", 1, 0))


@defop(kernel=_kernel, meta=_meta, signatures=_signatures, needs_ctx=True,
       backward=lambda ctx, g: (ctx.op.grads["scatter_add"](g, ctx.inputs[1], ctx.inputs[0],
                                                            **ctx.attrs), None),
       method=True)
def gather(op, x, dim: int, index):
    """Values of ``x`` along ``dim`` at ``index`` (PyTorch's ``torch.gather``): ``out`` has
    ``index``'s shape and ``out[i][j] = x[i][index[i][j]]`` for ``dim=1``. Differentiable
    in ``x`` (the gradient is added back at ``index``, repeated indices accumulating).

    >>> ct.gather(x, 1, idx)                 # x (4, 5), idx (4, 2) int64 -> (4, 2)
    >>> values = x.gather(-1, x.argmax(-1, keepdim=True))
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"gather: argument 'input' must be a ct.Tensor, got "
                        f"{type(x).__name__}")
    x, index = as_tensor([x, index], "gather")
    if index.ndim != x.ndim:
        raise ValueError(f"gather: argument 'index' has {index.ndim} dims (shape "
                         f"{tuple(index.shape)}) but the input has {x.ndim} (shape "
                         f"{tuple(x.shape)}); accepted: the same number of dims")
    if x.ndim == 0:  # as a 1-element 1-D gather
        return op(x.reshape(1), index.reshape(1), dim=0).reshape(())
    d = norm_dim("gather", dim, x.ndim)
    for e in range(x.ndim):
        if e != d and index.shape[e] > x.shape[e]:
            raise ValueError(f"gather: argument 'index' of shape {tuple(index.shape)} is "
                             f"larger than the input of shape {tuple(x.shape)} along dim "
                             f"{e}; accepted: index.shape[e] <= input.shape[e] for e != dim "
                             f"({d})")
    return op(x, index, dim=d)


gather.op.grad_kernel(
    "scatter_add", _scatter_add_kernel, needs_ctx=True,
    meta=lambda layouts, dim: [(tuple(layouts[2].shape), layouts[0].dtype)],
    signatures=_scatter_add_signatures,
    backward=lambda ctx, g: (gather.op(g, ctx.inputs[1], dim=ctx.attrs["dim"]), None, None))
