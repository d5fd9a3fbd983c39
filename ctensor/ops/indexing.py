"""Basic indexing and joining: ``x[index]``, narrow, split, chunk, cat, stack.

Signatures (1-D, per mesh axis):

* ``getitem``: B -> B; P -> P (and P(max)/P(min): picking elements commutes with the
  reduction over ranks); S(d) -> S(d') only for dims that the index leaves whole
  (``:``), ``d'`` being where that dim lands in the output. A split of a dim that is
  int-indexed or really sliced is not offered: the elements a shard would select do not in
  general form the output's uneven-rule shard, so boxing gathers that dim first.
* ``getitem_backward`` (internal): the gradient scattered into zeros of the input's shape,
  the mirror of ``getitem`` (S(d') -> S(d) for whole dims, B -> B, P -> P): each shard
  writes its local gradient into the region of the input it holds.
* ``cat``: S(e)..-> S(e) for e != the cat dim, B..-> B, P..-> P (and P(max)/P(min)).
"""
from __future__ import annotations

import math
import operator
from typing import Sequence

import numpy as np

from .._args import int_args
from ..dispatch import as_tensor
from ..tensor import Tensor
from ._rules import B, P, S, defop, norm_dim, result_dtype, sig
from .shape import partial_signatures, unsqueeze

_NEW, _INT, _ALL, _SLICE = "new", "int", "all", "slice"


class IndexOutOfRangeError(IndexError, ValueError):
    """An int index outside its dim: a ``ValueError`` like every bad argument, and an
    ``IndexError`` so that Python's sequence protocol (``for row in x``) stops on it."""


# ----------------------------------------------------------------------------- parsing
def _index_int(v, what: str) -> int:
    if isinstance(v, bool):
        raise TypeError(f"getitem: {what} must be an int or None, got {v!r} (bool)")
    try:
        return operator.index(v)
    except TypeError:
        given = "a ct.Tensor" if isinstance(v, Tensor) else f"{v!r} ({type(v).__name__})"
        raise TypeError(f"getitem: {what} must be an int or None, got {given}") from None


def parse_index(index, shape: tuple) -> tuple:
    """Normalise a basic index for ``shape`` into hashable entries, one per output-producing
    item: ``("new",)`` for None, ``("int", i)`` (i >= 0), ``("all",)`` for a dim kept
    whole, ``("slice", start, stop, step)`` otherwise. Every input dim gets an entry."""
    items = index if isinstance(index, tuple) else (index,)
    for it in items:
        if it is None or it is Ellipsis or isinstance(it, slice):
            continue
        if isinstance(it, bool) or isinstance(it, (Tensor, list, np.ndarray)) or \
                not hasattr(it, "__index__"):
            given = (f"a ct.Tensor of shape {tuple(it.shape)}" if isinstance(it, Tensor)
                     else f"{it!r} ({type(it).__name__})")  # a Tensor's repr would gather
            raise TypeError(f"getitem: index {given} is not supported; accepted: ints, "
                            f"slices with positive steps, None, ... and tuples of these "
                            f"(basic indexing)")
    if sum(it is Ellipsis for it in items) > 1:
        raise ValueError(f"getitem: index {index!r} has more than one '...'; accepted: at "
                         f"most one")
    used = sum(1 for it in items if it is not None and it is not Ellipsis)
    if used > len(shape):
        raise IndexOutOfRangeError(f"getitem: index {index!r} indexes {used} dims but the "
                                   f"tensor has {len(shape)} (shape {tuple(shape)})")
    expanded = []
    for it in items:
        if it is Ellipsis:
            expanded += [slice(None)] * (len(shape) - used)
        else:
            expanded.append(it)
    if not any(it is Ellipsis for it in items):
        expanded += [slice(None)] * (len(shape) - used)
    entries, d = [], 0
    for it in expanded:
        if it is None:
            entries.append((_NEW,))
            continue
        n = shape[d]
        if isinstance(it, slice):
            start = None if it.start is None else _index_int(it.start, "a slice start")
            stop = None if it.stop is None else _index_int(it.stop, "a slice stop")
            step = 1 if it.step is None else _index_int(it.step, "a slice step")
            if step <= 0:
                raise ValueError(f"getitem: slice step {step} on dim {d}; accepted: steps "
                                 f"> 0")
            start, stop, step = slice(start, stop, step).indices(n)
            stop = max(stop, start)
            whole = start == 0 and stop == n and step == 1
            entries.append((_ALL,) if whole else (_SLICE, start, stop, step))
        else:
            i = _index_int(it, "an index")
            if not -n <= i < n:
                raise IndexOutOfRangeError(f"getitem: index {i} is out of range for dim {d} "
                                           f"of size {n}; accepted: {-n}..{n - 1}")
            entries.append((_INT, i % n))
        d += 1
    return tuple(entries)


def _out_shape(entries: tuple, shape: tuple) -> tuple:
    out, d = [], 0
    for e in entries:
        if e[0] == _NEW:
            out.append(1)
            continue
        if e[0] == _ALL:
            out.append(shape[d])
        elif e[0] == _SLICE:
            out.append(len(range(e[1], e[2], e[3])))
        d += 1
    return tuple(out)


def _whole_dims(entries: tuple) -> list:
    """``(input dim, output dim)`` of every dim the index keeps whole."""
    pairs, d, j = [], 0, 0
    for e in entries:
        if e[0] == _NEW:
            j += 1
        elif e[0] == _INT:
            d += 1
        else:
            if e[0] == _ALL:
                pairs.append((d, j))
            d += 1
            j += 1
    return pairs


def _local_index(entries: tuple) -> tuple:
    """The NumPy index of the local selection: whole dims take the shard as it is (so a
    split of them needs no offset); the trailing ``...`` keeps 0-d results arrays."""
    out = []
    for e in entries:
        out.append(None if e[0] == _NEW else e[1] if e[0] == _INT else
                   slice(None) if e[0] == _ALL else slice(e[1], e[2], e[3]))
    return tuple(out) + (Ellipsis,)


# ----------------------------------------------------------------------------- getitem
def _getitem_signatures(layouts, index):
    cands = [sig([B], B)] + [sig([S(d)], S(j)) for d, j in _whole_dims(index)]
    return cands + partial_signatures(layouts)


def _scatter_signatures(layouts, index, shape):
    cands = [sig([B], B)] + [sig([S(j)], S(d)) for d, j in _whole_dims(index)]
    return cands + partial_signatures(layouts, (P,))


def _scatter_kernel(xp, g, index, shape, ctx):
    out = xp.zeros(tuple(b - a for a, b in ctx.out_region(0)), dtype=g.dtype)
    out[_local_index(index)] = g
    return out


@defop(kernel=lambda xp, x, index: x[_local_index(index)],
       meta=lambda layouts, index: [(_out_shape(index, layouts[0].shape), layouts[0].dtype)],
       signatures=_getitem_signatures, view=True, saves=(),
       backward=lambda ctx, g: (ctx.op.grads["scatter"](g, index=ctx.attrs["index"],
                                                        shape=tuple(ctx.inputs[0].shape)),))
def getitem(op, x, index):
    """Basic indexing ``x[index]``: ints (negative too), slices with positive steps,
    ``None`` and ``...``, or a tuple of them. Dims taken whole keep their split.

    >>> x[0, 1:5:2, None, ...]
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"getitem: expected a ct.Tensor, got {type(x).__name__}")
    entries = parse_index(index, tuple(x.shape))
    if all(e[0] == _ALL for e in entries):
        return x
    return op(x, index=entries)


# the gradient of getitem: the incoming gradient scattered into zeros of the input's shape
getitem.op.grad_kernel(
    "scatter", _scatter_kernel, needs_ctx=True,
    meta=lambda layouts, index, shape: [(tuple(shape), layouts[0].dtype)],
    signatures=_scatter_signatures,
    backward=lambda ctx, g: (getitem.op(g, index=ctx.attrs["index"]),))


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
