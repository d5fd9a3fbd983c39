"""Basic indexing and joining: ``x[index]``, narrow, split, chunk, cat, stack.

Signatures (1-D, per mesh axis):

* ``getitem``: B -> B; P -> P (and P(max)/P(min): picking elements commutes with the
  reduction over ranks); S(d) -> S(d') only for dims that the index leaves whole
  (``:``), ``d'`` being where that dim lands in the output. A split of a dim that is
  int-indexed or really sliced is not offered: the elements a shard would select do not in
  general form the output's uneven-rule shard, so boxing gathers that dim first. Indices
  beyond basic ones (tensors, lists, masks, negative steps) are written with other ops in
  :mod:`ctensor.ops.advanced_indexing`.
* ``getitem.scatter`` (the gradient): the gradient scattered into zeros of the input's
  shape, the mirror of ``getitem`` (S(d') -> S(d) for whole dims, B -> B, P -> P): each
  shard writes its local gradient into the region of the input it holds.
* ``getitem.assign`` (``x[index] = v`` for a basic index, out of place; ``v`` has the
  selection's shape): S(d), B -> S(d) for a dim the index picks from (each rank writes the
  selected elements inside its part: ``x[:, 0] = v`` of a column-split ``x`` stays local);
  S(d), S(d') -> S(d) for whole dims; B, B -> B; P, P -> P.
* ``cat``: S(e)..-> S(e) for e != the cat dim, B..-> B, P..-> P (and P(max)/P(min)).
"""
from __future__ import annotations

import math
import operator
from typing import Sequence

import numpy as np

from .._args import int_args
from ..dispatch import as_tensor
from ..registry import OPS
from ..tensor import Tensor
from ._rules import B, P, S, defop, norm_dim, result_dtype, sig
from .shape import partial_signatures, unsqueeze
from .advanced_indexing import advanced_getitem, is_advanced
from .index_parse import (ALL, INT, NEW, IndexOutOfRangeError, local_index, out_shape,
                          parse_index, whole_dims)

__all__ = ["getitem", "narrow", "split", "chunk", "cat", "stack", "IndexOutOfRangeError"]

# ----------------------------------------------------------------------------- getitem
def _getitem_signatures(layouts, index):
    cands = [sig([B], B)] + [sig([S(d)], S(j)) for d, j in whole_dims(index)]
    return cands + partial_signatures(layouts)


def _scatter_signatures(layouts, index, shape):
    cands = [sig([B], B)] + [sig([S(j)], S(d)) for d, j in whole_dims(index)]
    return cands + partial_signatures(layouts, (P,))


def _scatter_kernel(xp, g, index, shape, ctx):
    out = xp.zeros(tuple(b - a for a, b in ctx.out_region(0)), dtype=g.dtype)
    out[local_index(index)] = g
    return out


@defop(kernel=lambda xp, x, index: x[local_index(index)],
       meta=lambda layouts, index: [(out_shape(index, layouts[0].shape), layouts[0].dtype)],
       signatures=_getitem_signatures, view=True, saves=(),
       backward=lambda ctx, g: (ctx.op.grads["scatter"](g, index=ctx.attrs["index"],
                                                        shape=tuple(ctx.inputs[0].shape)),))
def getitem(op, x, index):
    """``x[index]``: ints (negative too), slices (negative steps as NumPy takes them),
    ``None`` and ``...``, integer and bool tensors, lists and arrays, or a tuple of them
    (PyTorch's rules, see :mod:`ctensor.ops.advanced_indexing`). Dims taken whole keep
    their split.

    >>> x[0, 1:5:2, None, ...]
    >>> x[x > 0]; x[:, idx]; x[rows, cols]; x[..., ::-1]
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"getitem: expected a ct.Tensor, got {type(x).__name__}")
    if is_advanced(index):
        return advanced_getitem(x, index)
    entries = parse_index(index, tuple(x.shape))
    if all(e[0] == ALL for e in entries):
        return x
    return op(x, index=entries)


# the gradient of getitem: the incoming gradient scattered into zeros of the input's shape
getitem.op.grad_kernel(
    "scatter", _scatter_kernel, needs_ctx=True,
    meta=lambda layouts, index, shape: [(tuple(shape), layouts[0].dtype)],
    signatures=_scatter_signatures,
    backward=lambda ctx, g: (getitem.op(g, index=ctx.attrs["index"]),))


# ----------------------------------------------------------------------------- assign
def _assign_signatures(layouts, index):
    x, _ = layouts
    # masked writes for the dims the index picks from; whole dims travel with v's (S(d), B
    # for one of them on a mesh axis and S(d), S(j) on another would not line up)
    whole = whole_dims(index)
    cands = [sig([B, B], B)] + [sig([S(d), B], S(d)) for d in range(x.ndim)
                                if d not in {w for w, _ in whole}]
    cands += [sig([S(d), S(j)], S(d)) for d, j in whole]
    return cands + ([sig([P, P], P)] if x.dtype.kind != "b" else [])


def _assign_kernel(xp, x, v, index, ctx):
    """``x`` with the selected elements inside this shard's region replaced by the matching
    elements of ``v``: per input dim, the selected global positions that fall in the region
    and, along ``v``'s dim, where they sit in the selection. The positions follow from the
    index alone: they are computed on the host (NumPy) and index the shards as they are (a
    device takes host integer indices without a synchronisation)."""
    out = x.copy()
    x_region, v_region = ctx.in_region(0), ctx.in_region(1)
    x_pos, v_pos, d, j = [], [], 0, 0
    for e in index:
        if e[0] == NEW:
            v_pos.append(np.zeros(1, dtype=np.int64))
            j += 1
            continue
        lo, hi = x_region[d]
        if e[0] == INT:
            chosen = np.asarray([e[1]])
        elif e[0] == ALL:
            chosen = np.arange(lo, hi)
        else:
            chosen = np.arange(e[1], e[2], e[3])
        inside = (chosen >= lo) & (chosen < hi)
        x_pos.append(chosen[inside] - lo)
        if e[0] != INT:
            rank_in_selection = chosen if e[0] == ALL else np.arange(chosen.shape[0])
            v_pos.append(rank_in_selection[inside] - v_region[j][0])
            j += 1
        d += 1
    if any(p.shape[0] == 0 for p in x_pos):
        return out
    values = v[np.ix_(*v_pos)] if v_pos else v
    out[np.ix_(*x_pos)] = values.reshape(tuple(p.shape[0] for p in x_pos))
    return out


def _assign_backward(ctx, g):
    index = ctx.attrs["index"]
    zero = OPS.to(as_tensor([g, 0.0], "setitem")[1], g.dtype)
    zeros = OPS.expand(zero, *out_shape(index, tuple(g.shape)))
    return getitem.op.grads["assign"](g, zeros, index=index), getitem.op(g, index=index)


getitem.op.grad_kernel(
    "assign", _assign_kernel, needs_ctx=True, saves=(),
    meta=lambda layouts, index: [(tuple(layouts[0].shape), layouts[0].dtype)],
    signatures=_assign_signatures, backward=_assign_backward)


@defop(method=True)
def narrow(x, dim: int, start: int, length: int):
    """Elements ``start .. start + length - 1`` of ``dim`` (``start`` may be negative).

    >>> x.narrow(1, 2, 3)        # x[:, 2:5]
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"narrow: expected a ct.Tensor, got {type(x).__name__}")
    d = norm_dim("narrow", dim, x.ndim)
    if x.ndim == 0:
        raise ValueError("narrow: the input is 0-d; accepted: tensors with at least 1 dim")
    n = x.shape[d]
    (start,) = int_args("narrow", "start", (start,))
    (length,) = int_args("narrow", "length", (length,))
    if not -n <= start <= n:
        raise ValueError(f"narrow: argument 'start' is {start} for dim {d} of size {n}; "
                         f"accepted: {-n}..{n}")
    if start < 0:
        start += n
    if length < 0 or start + length > n:
        raise ValueError(f"narrow: start {start} + length {length} exceeds dim {d} of size "
                         f"{n}; accepted: 0 <= length <= {n - start}")
    return getitem(x, (slice(None),) * d + (slice(start, start + length),))


@defop(method=True)
def split(x, split_size_or_sections, dim: int = 0) -> tuple:
    """Cut ``dim`` into pieces of ``split_size`` (the last may be smaller) or of the given
    section sizes; returns a tuple of tensors (each a narrow of ``x``).

    >>> q, k, v = qkv.split(64, dim=-1)
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"split: expected a ct.Tensor, got {type(x).__name__}")
    d = norm_dim("split", dim, x.ndim)
    n = x.shape[d]
    if isinstance(split_size_or_sections, (list, tuple)):
        sizes = [operator.index(s) for s in split_size_or_sections]
        if any(s < 0 for s in sizes) or sum(sizes) != n:
            raise ValueError(f"split: argument 'split_size_or_sections' {tuple(sizes)} must "
                             f"be sizes >= 0 adding up to {n} (dim {d}); given sum "
                             f"{sum(sizes)}")
    else:
        size = operator.index(split_size_or_sections)
        if size <= 0 and n > 0 or size < 0:
            raise ValueError(f"split: argument 'split_size' is {size}; accepted: > 0")
        sizes = [min(size, n - s) for s in range(0, n, size)] if n else [0]
    out, offset = [], 0
    for s in sizes:
        out.append(narrow(x, d, offset, s))
        offset += s
    return tuple(out)


@defop(method=True)
def chunk(x, chunks: int, dim: int = 0) -> tuple:
    """Split ``dim`` into ``chunks`` pieces of ``ceil(n / chunks)`` (PyTorch rule: fewer
    pieces when they run out).

    >>> a, b = x.chunk(2, dim=1)
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"chunk: expected a ct.Tensor, got {type(x).__name__}")
    chunks = operator.index(chunks)
    if chunks <= 0:
        raise ValueError(f"chunk: argument 'chunks' is {chunks}; accepted: > 0")
    n = x.shape[norm_dim("chunk", dim, x.ndim)]
    return split(x, max(math.ceil(n / chunks), 1), dim)


# ----------------------------------------------------------------------------- cat / stack
def _cat_meta(layouts, dim):
    first = layouts[0]
    for i, l in enumerate(layouts):
        if l.ndim != first.ndim or any(a != b for k, (a, b) in
                                       enumerate(zip(l.shape, first.shape)) if k != dim):
            raise ValueError(f"cat: argument 'tensors' has shapes "
                             f"{[tuple(t.shape) for t in layouts]}; tensor {i} differs from "
                             f"tensor 0 outside dim {dim}; accepted: equal shapes except "
                             f"along dim {dim}")
    shape = list(first.shape)
    shape[dim] = sum(l.shape[dim] for l in layouts)
    return [(tuple(shape), result_dtype("cat", [l.dtype for l in layouts]))]


def _cat_signatures(layouts, dim):
    k = len(layouts)
    cands = [sig([B] * k, B)]
    cands += [sig([S(e)] * k, S(e)) for e in range(layouts[0].ndim) if e != dim]
    return cands + partial_signatures(layouts)


def _cat_backward(ctx, g):
    dim, grads, offset = ctx.attrs["dim"], [], 0
    for t in ctx.inputs:
        n = t.shape[dim]
        gi = narrow(g, dim, offset, n)
        grads.append(gi.to(t.dtype) if gi.dtype != t.dtype and t.dtype.kind in "fc" else gi)
        offset += n
    return tuple(grads)


def _tensor_list(opname: str, tensors) -> list:
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{opname}: argument 'tensors' must be a list or tuple of tensors, "
                        f"got {type(tensors).__name__}")
    if not tensors:
        raise ValueError(f"{opname}: argument 'tensors' is empty; accepted: at least one "
                         f"tensor")
    return as_tensor(list(tensors), opname)


@defop(kernel=lambda xp, *arrays, dim: xp.concatenate(arrays, axis=dim), meta=_cat_meta,
       signatures=_cat_signatures, backward=_cat_backward)
def cat(op, tensors: Sequence, dim: int = 0):
    """Join tensors along an existing ``dim`` (shapes equal elsewhere); a split on another
    dim is kept.

    >>> ct.cat([a, b], dim=1)
    """
    tensors = _tensor_list("cat", tensors)
    if tensors[0].ndim == 0:
        raise ValueError("cat: argument 'tensors' holds 0-d tensors; accepted: tensors with "
                         "at least 1 dim (use ct.stack for scalars)")
    d = norm_dim("cat", dim, tensors[0].ndim)
    if len(tensors) == 1:
        return tensors[0]
    return op(*tensors, dim=d)


@defop()
def stack(tensors: Sequence, dim: int = 0):
    """Join equal-shaped tensors along a new ``dim``.

    >>> ct.stack([a, b], dim=0)   # two (3, 4) -> (2, 3, 4)
    """
    tensors = _tensor_list("stack", tensors)
    shapes = [tuple(t.shape) for t in tensors]
    if any(s != shapes[0] for s in shapes):
        raise ValueError(f"stack: argument 'tensors' has shapes {shapes}; accepted: equal "
                         f"shapes")
    d = norm_dim("stack", dim, tensors[0].ndim + 1)
    parts = [unsqueeze(t, d) for t in tensors]
    return parts[0] if len(parts) == 1 else cat.op(*parts, dim=d)
