"""Selection along one dim by an index tensor, and its data-dependent cousins:
``index_select``, ``index_add``, ``index_copy``, ``index_fill``, ``nonzero`` / ``argwhere``,
``masked_select``.

``index`` is a 1-D (or 0-d) integer tensor, list or NumPy array; negative entries count from
the end (PyTorch's ``x[idx]`` rule, which ctensor applies to these ops too); an entry outside
``[-n, n)`` raises ``ValueError`` (an ``IndexError`` as well) from the kernel on the ranks
that see it. Each kernel reads its shards' logical regions (the dispatch context), so a split
of the indexed dim is served by masked local work instead of a gather.

Signatures (1-D, per mesh axis; ``e != dim``):

============== ===================================== ======================================
 op             inputs -> output                      why
============== ===================================== ======================================
 index_select   B,B->B; S(e),B->S(e);                 rows of an unsplit dim stay local; an
                B,S(0)->S(dim); S(dim),B->P;          index split gives the output's dim its
                P,B->P                                uneven parts; a split indexed dim:
                                                      each rank looks up the ids it holds,
                                                      zeros elsewhere (embedding's rule)
 index_add      B,B,B->B; S(e),B,S(e)->S(e);          masked local writes: each rank adds
 (x, index,     S(dim),B,B->S(dim); P,B,P->P;         the rows that land in its part;
 source)        P,S(0),S(dim)->P                      source rows split with their index:
                                                      every rank adds its own, the sum over
                                                      ranks is the result (x boxed B->P, a
                                                      local step: the MoE combine)
 index_copy     as index_add without the last rule    (a replaced row is not a sum of parts)
 nonzero        B->B                                  the count is data-dependent: a split
                                                      mask is gathered first (below)
============== ===================================== ======================================

``nonzero`` (and ``masked_select``, ``x[mask]``) need the number of selected elements before
the output can be laid out: it is read with one ``.item()`` of the mask's sum (the one host
sync these ops cannot avoid; a split mask's sum is one small all-reduce). A rank's part of a
split mask would select a number of elements that does not follow the uneven rule, so
``nonzero`` takes the mask broadcast (boxing gathers a split one) and gives a broadcast
result; ``x[mask]`` then selects with it through ``index_select``, so a split ``x`` is looked
up where it lies (a partial result, reduced when read) and its unmasked dims keep their split.
"""
from __future__ import annotations

import numpy as np

from .. import _device
from ..arrays import is_host
from ..dispatch import as_tensor
from ..errors import MetaModeError
from ..meta import needs_values
from ..registry import OPS
from ..tensor import Tensor
from ._checks import check_range
from ._rules import B, P, S, defop, norm_dim, sig
from .embedding import index_add as add_at
from .index_parse import IndexOutOfRangeError

__all__ = ["index_select", "index_add", "index_copy", "index_fill", "nonzero", "argwhere",
           "masked_select", "normalized_index", "index_range", "index_tensor"]


# ----------------------------------------------------------------------------- helpers
def normalized_index(xp, opname: str, index, size: int):
    """``index`` with negative entries counted from the end; ``IndexOutOfRangeError``
    naming the op for an entry outside ``[-size, size)``. (On a GPU the range check is a
    device-side check raised at the next explicit transfer, ``ops/_checks.py``, and bad
    entries are clipped until then: no host read.)"""
    if not index.size:
        return index
    check_range(xp, opname + " index", index, size, lambda lo, hi: f"{opname}: index holds "
                f"values in [{lo}, {hi}], out of range for a dim of size {size}; accepted: "
                f"{-size}..{size - 1}", low_end=-size, error=IndexOutOfRangeError)
    if not is_host(index):
        return xp.clip(xp.where(index < 0, index + size, index), 0, size - 1)
    if index.min() < 0:
        return xp.where(index < 0, index + size, index)
    return index


def index_range(xp, index) -> tuple:
    """``(min, max)`` of a non-empty integer array as Python ints, in one read."""
    if xp is np:
        return int(index.min()), int(index.max())
    lo, hi = xp.stack([index.min(), index.max()]).tolist()
    return int(lo), int(hi)


def index_tensor(opname: str, x: Tensor, index, arg: str = "index") -> Tensor:
    """``index`` (a ct.Tensor, list or NumPy array of ints) as an integer tensor on ``x``'s
    placement; ``TypeError`` for other dtypes."""
    if isinstance(index, (list, tuple)) and not index:
        index = np.zeros(0, dtype=np.int64)
    elif isinstance(index, (list, tuple, np.ndarray)) and not isinstance(index, Tensor):
        index = np.asarray(index)
    elif not isinstance(index, Tensor):
        raise TypeError(f"{opname}: argument '{arg}' must be an integer ct.Tensor (or a list "
                        f"/ NumPy array of ints), got {type(index).__name__}")
    if index.dtype.kind not in "iu":
        raise TypeError(f"{opname}: argument '{arg}' must hold integers, got dtype "
                        f"{index.dtype}; convert it with .long()")
    return as_tensor([x, index], opname)[1]


def _check_1d(opname: str, index: Tensor) -> Tensor:
    if index.ndim > 1:
        raise ValueError(f"{opname}: argument 'index' must be 1-D (or 0-d), got shape "
                         f"{tuple(index.shape)}; flatten it with .reshape(-1)")
    return index.reshape(1) if index.ndim == 0 else index


def _moved(xp, a, dim: int):
    return xp.moveaxis(a, dim, 0)


# ----------------------------------------------------------------------------- index_select
def _select_meta(layouts, dim):
    x, index = layouts
    shape = list(x.shape)
    shape[dim] = index.shape[0]
    return [(tuple(shape), x.dtype)]


def _select_signatures(layouts, dim):
    x, _ = layouts
    cands = [sig([B, B], B)] + [sig([S(e), B], S(e)) for e in range(x.ndim) if e != dim]
    cands.append(sig([B, S(0)], S(dim)))
    if x.dtype.kind != "b":  # a partial sum of bools is not their value
        cands += [sig([S(dim), B], P), sig([P, B], P)]
    return cands


def _select_kernel(xp, x, index, dim, ctx):
    size = ctx.in_layouts[0].shape[dim]
    index = normalized_index(xp, "index_select", index, size)
    lo, hi = ctx.in_region(0)[dim]
    if hi - lo == size:
        return xp.take(x, index, axis=dim)
    local = index - lo
    inside = (local >= 0) & (local < hi - lo)
    shape = list(x.shape)
    shape[dim] = index.shape[0]
    if hi == lo:
        return xp.zeros(tuple(shape), dtype=x.dtype)
    # every index takes a row (those outside this shard row 0), zeroed where outside: no
    # boolean mask (a data-dependent shape, a host synchronisation on a GPU)
    picked = xp.take(x, xp.where(inside, local, 0), axis=dim)
    keep = inside.reshape((-1,) + (1,) * (x.ndim - 1 - dim))
    return xp.where(keep, picked, xp.zeros((), dtype=x.dtype))


def _select_backward(ctx, g):
    x, index = ctx.inputs
    # the gradient adds each row of g back where it was picked (repeats accumulate)
    base = OPS.expand(OPS.to(as_tensor([g, 0.0], "index_select")[1], g.dtype), *x.shape)
    return index_add.op(base, index, g, dim=ctx.attrs["dim"], alpha=1), None


@defop(kernel=_select_kernel, meta=_select_meta, signatures=_select_signatures,
       needs_ctx=True, saves=(1,), backward=_select_backward, method=True)
def index_select(op, input, dim: int, index):  # noqa: A002 - PyTorch's name
    """The entries of ``input`` along ``dim`` at the 1-D integer ``index`` (PyTorch's
    ``torch.index_select``; negative entries count from the end). Differentiable in
    ``input`` (repeated entries accumulate their gradients).

    >>> ct.index_select(x, 0, ct.tensor([2, 0], placement=p))   # rows 2 and 0
    >>> x.index_select(1, [0, 0, 3])
    """
    x = as_tensor([input], "index_select")[0]
    if x.ndim == 0:
        return op(x.reshape(1), _check_1d("index_select", index_tensor(
            "index_select", x, index)), dim=0).reshape(())
    d = norm_dim("index_select", dim, x.ndim)
    return op(x, _check_1d("index_select", index_tensor("index_select", x, index)), dim=d)


# ----------------------------------------------------------------------------- index_add / copy
def _put_meta(opname: str):
    def meta(layouts, dim, **_):
        x, index, source = layouts
        expected = list(x.shape)
        expected[dim] = index.shape[0]
        if tuple(source.shape) != tuple(expected):
            raise ValueError(f"{opname}: argument 'source' has shape {tuple(source.shape)}; "
                             f"accepted: {tuple(expected)} (the input's shape with dim {dim} "
                             f"of the index's length {index.shape[0]})")
        return [(tuple(x.shape), x.dtype)]
    return meta


def _put_signatures(additive: bool):
    def signatures(layouts, dim, **_):
        x = layouts[0]
        cands = [sig([B, B, B], B)]
        cands += [sig([S(e), B, S(e)], S(e)) for e in range(x.ndim) if e != dim]
        cands.append(sig([S(dim), B, B], S(dim)))
        if x.dtype.kind != "b":
            cands.append(sig([P, B, P], P))
            if additive:
                cands.append(sig([P, S(0), S(dim)], P))
        return cands
    return signatures


def _put_kernel(opname: str, additive: bool):
    def kernel(xp, x, index, source, dim, ctx, alpha=1):
        size = ctx.out_layouts[0].shape[dim]
        index = normalized_index(xp, opname, index, size)
        lo, hi = ctx.out_region(0)[dim]
        out = x.copy()
        local = index - lo
        inside = (local >= 0) & (local < hi - lo)
        rows = _moved(xp, source, dim)
        rows = rows * alpha if additive and alpha != 1 else rows
        _put_rows(xp, _moved(xp, out, dim), local, inside, rows, additive)
        return out
    return kernel


def _put_rows(xp, target, local, inside, rows, additive: bool) -> None:
    """``target[local] (+)= rows`` for the rows ``inside`` this shard (``target`` a view)."""
    if is_host(local):
        if additive:
            add_at(xp, target, local[inside], rows[inside])
        else:
            target[local[inside]] = rows[inside]
        return
    # on a device no boolean mask (a data-dependent shape, a host synchronisation): the rows
    # outside this shard land in a scratch row after the last one, then dropped
    n = target.shape[0]
    ext = xp.concatenate([target, xp.zeros((1,) + tuple(target.shape[1:]), target.dtype)])
    pos = xp.where(inside, local, n)
    if additive:
        add_at(xp, ext, pos, rows)
    else:
        ext[pos] = rows
    target[...] = ext[:n]


def _put_front(opname: str, op, x, dim, index, source, **attrs):
    x = as_tensor([x], opname)[0]
    if x.ndim == 0:
        return _put_front(opname, op, x.reshape(1), 0, index,
                          as_tensor([x, source], opname)[1].reshape(-1), **attrs).reshape(())
    d = norm_dim(opname, dim, x.ndim)
    index = _check_1d(opname, index_tensor(opname, x, index))
    source = as_tensor([x, source], opname)[1]
    if source.dtype != x.dtype:
        if np.dtype(source.dtype).kind == "f" and x.dtype.kind in "iub":
            raise TypeError(f"{opname}: argument 'source' has dtype {source.dtype} but the "
                            f"input has {x.dtype}; accepted: the input's dtype (convert one "
                            f"with .to())")
        source = OPS.to(source, x.dtype)
    return op(x, index, source, dim=d, **attrs)


def _add_backward(ctx, g):
    dim, alpha = ctx.attrs["dim"], ctx.attrs["alpha"]
    gs = index_select.op(g, ctx.inputs[1], dim=dim)
    return g, None, gs * alpha if alpha != 1 else gs


@defop(kernel=_put_kernel("index_add", True), meta=_put_meta("index_add"),
       signatures=_put_signatures(True), needs_ctx=True, saves=(1,),
       backward=_add_backward, method=True)
def index_add(op, input, dim: int, index, source, *, alpha=1):  # noqa: A002
    """``input`` with ``alpha * source`` added into the entries of ``dim`` named by the 1-D
    ``index`` (repeated entries accumulate); PyTorch's ``torch.index_add``.

    >>> out = ct.index_add(out, 0, token_ids, expert_out)     # MoE: combine expert rows
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.number)):
        raise TypeError(f"index_add: argument 'alpha' must be a number, got "
                        f"{type(alpha).__name__}")
    return _put_front("index_add", op, input, dim, index, source, alpha=alpha)


def _copy_backward(ctx, g):
    dim, index = ctx.attrs["dim"], ctx.inputs[1]
    n = index.shape[0]
    shape = list(g.shape)
    shape[dim] = n
    zeros = OPS.expand(OPS.to(as_tensor([g, 0.0], "index_copy")[1], g.dtype), *shape)
    return (index_copy.op(g, index, zeros, dim=dim), None,
            index_select.op(g, index, dim=dim))


@defop(kernel=_put_kernel("index_copy", False), meta=_put_meta("index_copy"),
       signatures=_put_signatures(False), needs_ctx=True, saves=(1,),
       backward=_copy_backward, method=True)
def index_copy(op, input, dim: int, index, source):  # noqa: A002
    """``input`` with the entries of ``dim`` named by the 1-D ``index`` replaced by the rows
    of ``source`` (PyTorch's ``torch.index_copy``; with repeated entries one of the rows
    wins, as in PyTorch).

    >>> x.index_copy(0, ct.tensor([0, 4], placement=p), rows)
    """
    return _put_front("index_copy", op, input, dim, index, source)


@defop(method=True)
def index_fill(input, dim: int, index, value):  # noqa: A002
    """``input`` with ``value`` (a number or a 0-d tensor) in the entries of ``dim`` named by
    the 1-D ``index`` (PyTorch's ``index_fill``).

    >>> x.index_fill(1, [0, 2], -1.0)
    """
    x = as_tensor([input], "index_fill")[0]
    if isinstance(value, Tensor) and value.ndim != 0:
        raise ValueError(f"index_fill: argument 'value' must be a number or a 0-d tensor, "
                         f"got a tensor of shape {tuple(value.shape)}")
    if x.ndim == 0:
        return index_fill(x.reshape(1), 0, index, value).reshape(())
    d = norm_dim("index_fill", dim, x.ndim)
    index = _check_1d("index_fill", index_tensor("index_fill", x, index))
    shape = list(x.shape)
    shape[d] = index.shape[0]
    v = OPS.to(as_tensor([x, value], "index_fill")[1], x.dtype)
    return index_copy(x, d, index, OPS.expand(v, *shape))


# ----------------------------------------------------------------------------- nonzero
def _nonzero_meta(layouts, count, flat):
    (mask,) = layouts
    return [((count,) if flat else (count, mask.ndim), np.dtype(np.int64))]


def _nonzero_kernel(xp, mask, count, flat):
    return xp.flatnonzero(mask) if flat else xp.argwhere(mask)


def selected_count(mask: Tensor, opname: str = "nonzero") -> int:
    """The number of True entries of the bool ``mask`` (one ``.item()``: a host sync)."""
    needs_values(lambda: MetaModeError(
        f"{opname}: the number of selected elements depends on the mask's values, which a "
        f"shape-only tensor (ct.simulate(n, meta=True)) does not hold; plan with a constant "
        f"mask or index (a NumPy array or list), or with index_select and a fixed-size "
        f"index"))
    with _device.implicit():  # the op's own read, for ct.debug.set_sync_debug_mode
        return int(OPS.sum(mask).item())


def nonzero_positions(mask: Tensor, flat: bool = False, opname: str = "nonzero") -> Tensor:
    """The positions of ``mask``'s True entries (flat positions with ``flat``), int64,
    broadcast on the mask's placement."""
    return nonzero.op(mask, count=selected_count(mask, opname), flat=bool(flat))


@defop(kernel=_nonzero_kernel, meta=_nonzero_meta,
       signatures=lambda layouts, **_: [sig([B], B)], method=True)
def nonzero(op, input, *, as_tuple: bool = False):  # noqa: A002
    """The indices of the non-zero (True) entries of ``input``, in row-major order: an int64
    ``(count, input.ndim)`` tensor, or with ``as_tuple=True`` one 1-D tensor per dim
    (``ct.where(cond)``). The count is data-dependent: it is read with one host sync, and
    the result is broadcast (a split input is gathered first).

    >>> ct.nonzero(ct.tensor([[0, 1], [2, 0]], placement=p))       # [[0, 1], [1, 0]]
    >>> rows, cols = (x > 0).nonzero(as_tuple=True)
    """
    x = as_tensor([input], "nonzero")[0]
    mask = x if x.dtype.kind == "b" else OPS.ne(x, 0)
    count = selected_count(mask)
    if as_tuple and x.ndim == 0:  # PyTorch: one index tensor (zeros) for a 0-d input
        return (op(mask.reshape(1), count=count, flat=True),)
    out = op(mask, count=count, flat=False)
    if not as_tuple:
        return out
    return tuple(OPS.getitem(out, (slice(None), j)) for j in range(x.ndim))


@defop(method=True)
def argwhere(input):  # noqa: A002
    """``nonzero(input)``: the ``(count, ndim)`` indices of the non-zero entries.

    >>> ct.argwhere(x > 0)
    """
    return nonzero(input)


@defop(method=True)
def masked_select(input, mask):  # noqa: A002
    """The entries of ``input`` where the bool ``mask`` is True, as a 1-D tensor (the two
    broadcast together first); ``input[mask]`` for equal shapes. Differentiable in
    ``input``; the count is read with one host sync.

    >>> ct.masked_select(x, x > 0)
    """
    x, m = as_tensor([input, mask], "masked_select")
    if m.dtype.kind != "b":
        raise TypeError(f"masked_select: argument 'mask' must be a bool tensor, got "
                        f"{m.dtype}")
    try:
        shape = tuple(np.broadcast_shapes(tuple(x.shape), tuple(m.shape)))
    except ValueError:
        raise ValueError(f"masked_select: the input of shape {tuple(x.shape)} and the mask of "
                         f"shape {tuple(m.shape)} cannot be broadcast together") from None
    if tuple(x.shape) != shape:
        x = OPS.expand(x, *shape)
    if tuple(m.shape) != shape:
        m = OPS.expand(m, *shape)
    flat = x.reshape(-1)
    return index_select.op(flat, nonzero_positions(m.reshape(-1), True, "masked_select"),
                           dim=0)
