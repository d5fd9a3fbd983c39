"""``scatter`` (PyTorch's ``torch.scatter``: a src tensor or a value, ``reduce=None | "add" |
"multiply"``), ``scatter_add`` and ``take_along_dim``.

``out = x`` except ``out[i][index[i][j]] = src[i][j]`` for ``dim == 1`` (``+=`` with
``reduce="add"``, ``*=`` with ``"multiply"``); ``index`` has ``x``'s number of dims, is no
larger than ``src`` anywhere nor than ``x`` outside ``dim``, and only ``src``'s part of
``index``'s shape is read. Index values lie in ``[0, x.shape[dim])`` (as in PyTorch, no
negatives). One kernel serves every signature: each index element's logical position in
``x`` (its own position outside ``dim``, its value along it) is computed from the regions of
the shards (dispatch context), and only the positions inside the rank's part of ``x`` are
written: a masked local write.

Signatures (1-D, per mesh axis), ``x, index, src -> out``:

================================ ==========================================================
 S(dim), B, B -> S(dim)           each rank writes the positions inside its part of ``dim``
 S(e), S(e), S(e) -> S(e)         rows of x, index and src travel together (e != dim, when
                                  x and index have the same size along e)
 B, B, B -> B                     every rank writes everything
 P, B, P -> P                     not for ``multiply``: replacing or adding the same
                                  positions on every rank commutes with the sum over ranks
 P, S(e), S(e) -> P               ``add`` only: each rank adds its own part of index/src,
                                  the sum over ranks is the result (x boxed B -> P locally);
                                  for e == dim, or e where the rule above is not offered
================================ ==========================================================

Gradients (PyTorch's): ``scatter``: x gets ``g`` with the written positions zeroed, src gets
``gather(g, dim, index)``; ``add``: x gets ``g``, src the gather; ``multiply`` has none (a
``RuntimeError`` in the backward, as PyTorch's).
"""
from __future__ import annotations

import numpy as np

from ..dispatch import as_tensor
from ..registry import OPS
from ..tensor import Tensor
from ._rules import B, P, S, defop, norm_dim, sig
from .embedding import check_int
from ..arrays import is_host
from .embedding import index_add as add_at
from ._checks import check_range

__all__ = ["scatter", "scatter_add", "take_along_dim", "scatter_targets", "scatter_signatures",
           "multiply_at", "scratch_target", "scratch_result"]

_REDUCES = (None, "add", "multiply")


def _meta(layouts, dim, reduce):
    x, index, src = layouts
    check_int("scatter", "index", index)
    return [(tuple(x.shape), x.dtype)]


def scatter_signatures(x, index, dim: int, partial: bool, adds: bool) -> list:
    """The signatures of a scatter of ``src`` into ``x`` at ``index`` along ``dim`` (also
    ``scatter_reduce``'s): ``partial`` where a partial ``x`` and ``src`` give the partial
    result (the write is linear), ``adds`` where it also adds into ``x`` (then a split index
    and src write into a partial ``x``)."""
    # (no S(e), B, B for e != dim: another mesh axis taking S(e), S(e), S(e) would leave a
    # rank's part of x outside its part of index; boxing index B -> S(e) is a local slice)
    cands = [sig([B, B, B], B), sig([S(dim), B, B], S(dim))]
    cands += [sig([S(e), S(e), S(e)], S(e)) for e in range(x.ndim)
              if e != dim and x.shape[e] == index.shape[e]]
    if partial and x.dtype.kind != "b":
        cands.append(sig([P, B, P], P))
        if adds:  # (not where S(e), S(e), S(e) is offered: another mesh axis taking that
            # would split x's part of e differently from index's)
            cands += [sig([P, S(e), S(e)], P) for e in range(x.ndim)
                      if e == dim or x.shape[e] != index.shape[e]]
    return cands


def _signatures(layouts, dim, reduce):
    x, index, _ = layouts
    return scatter_signatures(x, index, dim, partial=reduce != "multiply", adds=reduce == "add")


def scatter_targets(xp, opname: str, index, dim: int, ctx):
    """The local positions (a tuple of coordinate arrays) the index elements inside this
    shard's part of the output write to, and which index elements those are (a mask).

    On a device (no boolean mask: a data-dependent shape, a host synchronisation) every
    element gets a position, those outside this shard the scratch row one past the end of
    dim 0 (:func:`scratch_target`), and the mask is ``None``."""
    size = ctx.out_layouts[0].shape[dim]
    check_range(xp, opname, index, size, lambda lo, hi: f"{opname}: argument 'index' must "
                f"hold values in [0, {size}), got values in [{lo}, {hi}]")
    x_region, index_region = ctx.out_region(0), ctx.in_region(1)
    coords, inside = [], xp.ones(index.shape, dtype=bool)
    for a in range(index.ndim):
        lo, hi = x_region[a]
        if a == dim:
            c = index
        else:  # the index element's own logical position along a
            shape = [1] * index.ndim
            shape[a] = index.shape[a]
            c = xp.broadcast_to(xp.arange(*index_region[a]).reshape(shape), index.shape)
        inside &= (c >= lo) & (c < hi)
        coords.append(c - lo)
    if is_host(index):
        return tuple(c[inside] for c in coords), inside
    rows = x_region[0][1] - x_region[0][0]
    return tuple(xp.where(inside, c, rows if a == 0 else 0) for a, c in enumerate(coords)), None


def scratch_target(xp, out, inside):
    """``(target, values_of)``: where a scatter writes (``out``, or on a device ``out`` with
    the scratch row appended) and how its values are picked from ``src``."""
    if inside is not None:
        return out, lambda src: src[inside]
    extra = xp.zeros((1,) + tuple(out.shape[1:]), dtype=out.dtype)
    return xp.concatenate([out, extra], axis=0), lambda src: src


def scratch_result(out, target):
    """``target`` without the scratch row (``out`` itself on the host)."""
    return target if target.shape[0] == out.shape[0] else target[:out.shape[0]].copy()


def _kernel(xp, x, index, src, dim, reduce, ctx):
    out = x.copy()
    if index.size == 0 or out.size == 0:
        return out
    where, inside = scatter_targets(xp, "scatter", index, dim, ctx)
    target, values_of = scratch_target(xp, out, inside)
    values = values_of(src)
    if reduce is None:
        target[where] = values
    elif reduce == "add":
        add_at(xp, target, where, values)
    else:
        multiply_at(xp, target, where, values)
    return scratch_result(out, target)


def multiply_at(xp, out, where, values) -> None:
    """``out[where] *= values`` with repeated positions multiplying in turn."""
    if xp is np or hasattr(xp.multiply, "at"):
        xp.multiply.at(out, where, values)
        return
    host = xp.asnumpy(out)  # (a CuPy without multiply.at: on the host)
    np.multiply.at(host, tuple(xp.asnumpy(w) for w in where), xp.asnumpy(values))
    out[...] = xp.asarray(host)


def _backward(ctx, g):
    dim, reduce = ctx.attrs["dim"], ctx.attrs["reduce"]
    index = ctx.inputs[1]
    if reduce == "multiply":
        raise RuntimeError("scatter: the gradient of reduce='multiply' is not implemented "
                           "(as in PyTorch); use reduce=None or 'add', or detach the inputs")
    g_src = OPS.gather(g, dim, index)
    if reduce == "add":
        return g, None, g_src
    zero = OPS.to(as_tensor([g, 0.0], "scatter")[1], g.dtype)
    return scatter.op(g, index, OPS.expand(zero, *index.shape), dim=dim, reduce=None), \
        None, g_src


@defop(kernel=_kernel, meta=_meta, signatures=_signatures, needs_ctx=True, saves=(1,),
       backward=_backward, method=True)
def scatter(op, input, dim: int, index, src=None, *, value=None,  # noqa: A002
            reduce=None):
    """``input`` with the entries of ``src`` (or ``value``) written along ``dim`` at
    ``index`` (PyTorch's ``torch.scatter``); ``reduce="add"`` / ``"multiply"`` combines
    with what is there instead. Differentiable (except ``multiply``).

    >>> ct.zeros(2, 5, placement=p).scatter(1, idx, src)
    >>> one_hot = ct.zeros(4, 10, placement=p).scatter(1, labels[:, None], 1.0)
    """
    if not isinstance(input, Tensor):
        raise TypeError(f"scatter: argument 'input' must be a ct.Tensor, got "
                        f"{type(input).__name__}")
    if reduce not in _REDUCES:
        raise ValueError(f"scatter: argument 'reduce' is {reduce!r}; accepted: None, 'add', "
                         f"'multiply' (use scatter_reduce's names through these)")
    if (src is None) == (value is None):
        raise TypeError("scatter: give exactly one of 'src' (a tensor or a number) and "
                        "'value' (a number)")
    return _scatter(op, "scatter", input, dim, index, value if src is None else src, reduce)


def _scatter(op, opname, x, dim, index, src, reduce):
    x, index = as_tensor([x, index], opname)
    if not isinstance(index, Tensor) or index.dtype.kind not in "iu":
        raise TypeError(f"{opname}: argument 'index' must be an integer tensor, got "
                        f"{getattr(index, 'dtype', type(index).__name__)}")
    if index.ndim != x.ndim:
        raise ValueError(f"{opname}: argument 'index' has {index.ndim} dims (shape "
                         f"{tuple(index.shape)}) but the input has {x.ndim} (shape "
                         f"{tuple(x.shape)}); accepted: the same number of dims")
    if x.ndim == 0:
        src = as_tensor([x, src], opname)[1]
        return _scatter(op, opname, x.reshape(1), 0, index.reshape(1),
                        src.reshape(1) if isinstance(src, Tensor) and src.ndim == 0 else src,
                        reduce).reshape(())
    d = norm_dim(opname, dim, x.ndim)
    for e in range(x.ndim):
        if e != d and index.shape[e] > x.shape[e]:
            raise ValueError(f"{opname}: argument 'index' of shape {tuple(index.shape)} is "
                             f"larger than the input of shape {tuple(x.shape)} along dim {e}; "
                             f"accepted: index.shape[e] <= input.shape[e] for e != dim ({d})")
    if isinstance(src, Tensor):
        src = as_tensor([x, src], opname)[1]
        if src.ndim != x.ndim or any(i > s for i, s in zip(index.shape, src.shape)):
            raise ValueError(f"{opname}: argument 'src' of shape {tuple(src.shape)} is smaller "
                             f"than the index of shape {tuple(index.shape)}; accepted: src "
                             f"with the input's number of dims, at least the index's size "
                             f"in every dim")
        if tuple(src.shape) != tuple(index.shape):
            src = OPS.getitem(src, tuple(slice(0, n) for n in index.shape))
    else:
        if isinstance(src, bool) or not isinstance(src, (int, float, np.number, np.bool_)):
            raise TypeError(f"{opname}: argument 'src' / 'value' must be a tensor or a "
                            f"number, got {type(src).__name__}")
        src = OPS.expand(as_tensor([x, src], opname)[1], *index.shape)
    if src.dtype != x.dtype:
        src = OPS.to(src, x.dtype)
    return op(x, index, src, dim=d, reduce=reduce)


@defop(method=True)
def scatter_add(input, dim: int, index, src):  # noqa: A002
    """``scatter(input, dim, index, src, reduce="add")``: ``src`` added at ``index``
    (repeated positions accumulate). PyTorch's ``torch.scatter_add``.

    >>> counts = ct.zeros(3, placement=p).scatter_add(0, labels, ct.ones(8, placement=p))
    """
    if not isinstance(src, Tensor):
        raise TypeError(f"scatter_add: argument 'src' must be a ct.Tensor, got "
                        f"{type(src).__name__}")
    if not isinstance(input, Tensor):
        raise TypeError(f"scatter_add: argument 'input' must be a ct.Tensor, got "
                        f"{type(input).__name__}")
    return _scatter(scatter.op, "scatter_add", input, dim, index, src, "add")


@defop(method=True)
def take_along_dim(input, indices, dim=None):  # noqa: A002
    """Values of ``input`` at ``indices`` along ``dim`` (PyTorch's ``torch.take_along_dim``):
    the two broadcast together outside ``dim``, then :func:`ct.gather`; with ``dim=None``
    both are flattened.

    >>> ct.take_along_dim(x, x.argsort(dim=1), dim=1)
    """
    x, index = as_tensor([input, indices], "take_along_dim")
    if index.dtype.kind not in "iu":
        raise TypeError(f"take_along_dim: argument 'indices' must be an integer tensor, got "
                        f"{index.dtype}")
    if dim is None:
        return OPS.gather(x.reshape(-1), 0, index.reshape(-1))
    if index.ndim != x.ndim:
        raise ValueError(f"take_along_dim: argument 'indices' has {index.ndim} dims but the "
                         f"input has {x.ndim}; accepted: the same number of dims")
    d = norm_dim("take_along_dim", dim, x.ndim)
    try:
        xs = list(np.broadcast_shapes(tuple(x.shape[e] for e in range(x.ndim) if e != d),
                                      tuple(index.shape[e] for e in range(x.ndim) if e != d)))
    except ValueError:
        raise ValueError(f"take_along_dim: the input of shape {tuple(x.shape)} and indices of "
                         f"shape {tuple(index.shape)} cannot be broadcast outside dim "
                         f"{d}") from None
    x_shape, i_shape = list(xs), list(xs)
    x_shape.insert(d, x.shape[d])
    i_shape.insert(d, index.shape[d])
    if tuple(x.shape) != tuple(x_shape):
        x = OPS.expand(x, *x_shape)
    if tuple(index.shape) != tuple(i_shape):
        index = OPS.expand(index, *i_shape)
    return OPS.gather(x, d, index)
