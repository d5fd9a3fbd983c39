"""Shape ops: reshape / view / flatten / unsqueeze / squeeze, permute / transpose / t, flip,
repeat, expand / broadcast_to, contiguous.

None of these mixes values across elements, so B -> B and P -> P always hold (P(max) and
P(min) as well for the pure data movements: moving each rank's array the same way commutes
with the elementwise reduction over ranks). Splits (1-D, per mesh axis):

* ``reshape`` (and every op written with it): S(d) -> S(d') when input dim ``d`` and output
  dim ``d'`` start at the same flat offset (equal products of the dims before them) and
  each part of ``d`` covers the same flat range as the matching part of ``d'``. That holds
  when the two dims have the same size (the blocks below them are then equal, so any uneven
  split matches), or when both sizes are multiples of the number K of parts the dim is cut
  into (the mesh axis's size, times those of the other axes that split the same dim):
  every part then holds total/K consecutive elements of the block. Other splits are not offered, so boxing gathers first.
  The kernel then is a plain local reshape to the output shard's shape.
* ``permute``: S(d) -> S(j) where ``dims[j] == d``; a local transpose.
* ``expand``: S(d) -> S(d + new leading dims) for dims that keep their size.
* ``flip``: S(d) -> S(d) for dims not flipped; ``repeat``: S(d) -> S(d + new leading dims)
  for dims repeated once (a flipped or repeated split dim is gathered first).
"""
from __future__ import annotations

import math
from typing import Optional

from .._args import int_args, unpack_sizes
from ..dispatch import as_tensor
from ..registry import OPS
from ._rules import B, P, PMAX, PMIN, S, defop, norm_dim, sig
from .elementwise import sum_to

_PARTIALS = (P, PMAX, PMIN)


def partial_signatures(layouts, kinds=_PARTIALS) -> list:
    """``P..-> P`` (per partial kind in ``kinds``) for the kinds some input already has.

    Boxing S -> P is a local zero-pad that the cost model counts as free, so offering P to
    inputs that are not partial would turn a gather of a split into a full-size partial
    output (memory x ranks and an all-reduce later); shape ops keep a partial input partial
    and never make one.
    """
    present = {s for l in layouts for s in l.sbp}
    return [sig([p] * len(layouts), p) for p in kinds if p in present]


# ----------------------------------------------------------------------------- helpers
def _one(opname: str, x):
    """``x`` as a ct.Tensor (NumPy arrays and scalars promoted), for one-input ops."""
    return as_tensor([x], opname)[0]


def _size_args(opname: str, arg: str, sizes: tuple) -> tuple:
    """Accept ``f(2, 3)`` and ``f((2, 3))`` / ``f([2, 3])`` alike, as ints."""
    return int_args(opname, arg, unpack_sizes(sizes))


def _local_shape(ctx) -> tuple:
    return tuple(b - a for a, b in ctx.out_region(0))


# ----------------------------------------------------------------------------- reshape
def _aligned_dim(in_shape: tuple, out_shape: tuple, d: int, mesh_size: int) -> Optional[int]:
    """The output dim that a split of input dim ``d`` maps to without moving data, or None
    (see the module docstring for the rule)."""
    lead, n = math.prod(in_shape[:d]), in_shape[d]
    divisible, acc = None, 1
    for j, m in enumerate(out_shape):
        if acc == lead:
            if m == n:
                return j
            if divisible is None and n % mesh_size == 0 and m % mesh_size == 0:
                divisible = j
        elif acc > lead:
            break
        acc *= m
    return divisible


def _reshape_meta(layouts, shape):
    (x,) = layouts
    if math.prod(shape) != math.prod(x.shape):
        raise ValueError(f"reshape: argument 'shape' is {tuple(shape)} "
                         f"({math.prod(shape)} elements) but the input of shape "
                         f"{tuple(x.shape)} has {math.prod(x.shape)}; accepted: shapes "
                         f"with {math.prod(x.shape)} elements (one dim may be -1)")
    return [(tuple(shape), x.dtype)]


def _reshape_signatures(layouts, shape, mesh_axis):
    (x,) = layouts
    cands = [sig([B], B)]
    if x.numel > 0:
        mesh = x.placement.shape
        for d in range(x.ndim):
            # the parts dim d is cut into if this axis splits it too (nested splits)
            parts = mesh[mesh_axis] * math.prod(
                n for a, n in enumerate(mesh) if a != mesh_axis and x.sbp[a] == S(d))
            j = _aligned_dim(tuple(x.shape), tuple(shape), d, parts)
            if j is not None:
                cands.append(sig([S(d)], S(j)))
    return cands + partial_signatures(layouts)


def _resolve_shape(opname: str, sizes: tuple, numel: int, given: tuple) -> tuple:
    """Fill in one ``-1`` and check the element count (``ValueError`` naming ``opname``)."""
    if sizes.count(-1) > 1:
        raise ValueError(f"{opname}: argument 'shape' {sizes} has more than one -1; "
                         f"accepted: at most one inferred dim")
    bad = [n for n in sizes if n < -1]
    if bad:
        raise ValueError(f"{opname}: argument 'shape' {sizes} has negative size {bad[0]}; "
                         f"accepted: sizes >= 0 and at most one -1")
    if -1 in sizes:
        known = math.prod(n for n in sizes if n != -1)
        if known == 0 or numel % known:
            raise ValueError(f"{opname}: shape {sizes} is invalid for an input of shape "
                             f"{given} ({numel} elements): the -1 cannot be inferred")
        sizes = tuple(numel // known if n == -1 else n for n in sizes)
    if math.prod(sizes) != numel:
        raise ValueError(f"{opname}: shape {sizes} ({math.prod(sizes)} elements) is invalid "
                         f"for an input of shape {given} ({numel} elements); accepted: "
                         f"shapes with {numel} elements (one dim may be -1)")
    return sizes


def _reshape(opname: str, x, sizes: tuple):
    shape = _resolve_shape(opname, sizes, x.numel(), tuple(x.shape))
    if shape == tuple(x.shape):
        return x
    return reshape.op(x, shape=shape)


@defop(kernel=lambda xp, x, shape, ctx: x.reshape(_local_shape(ctx)), needs_ctx=True,
       meta=_reshape_meta, signatures=_reshape_signatures, per_axis=True, view=True,
       saves=(),
       backward=lambda ctx, g: (reshape(g, ctx.inputs[0].shape),), method=True)
def reshape(op, x, *shape):
    """The same elements in a new shape (row-major); one dim may be ``-1``.

    A split survives when its shards stay contiguous blocks of the new shape, e.g. an
    ``(8, 6)`` tensor split on dim 0 reshaped to ``(8, 2, 3)`` stays ``S(0)`` with no
    communication.

    >>> x.reshape(2, -1); ct.reshape(x, (2, 3))
    """
    x = _one("reshape", x)
    return _reshape("reshape", x, _size_args("reshape", "shape", shape))


@defop(method=True)
def view(x, *shape):
    """Same as :func:`reshape` (the result may share memory with ``x``).

    >>> x.view(-1)
    """
    x = _one("view", x)
    return _reshape("view", x, _size_args("view", "shape", shape))


@defop(method=True)
def flatten(x, start_dim: int = 0, end_dim: int = -1):
    """Merge dims ``start_dim..end_dim`` (inclusive) into one; a 0-d tensor becomes 1-D.

    >>> ct.flatten(x, 1)         # (2, 3, 4) -> (2, 12)
    """
    x = _one("flatten", x)
    if x.ndim == 0:
        return _reshape("flatten", x, (1,))
    start = norm_dim("flatten", start_dim, x.ndim, "start_dim")
    end = norm_dim("flatten", end_dim, x.ndim, "end_dim")
    if start > end:
        raise ValueError(f"flatten: argument 'start_dim' ({start_dim}) comes after "
                         f"'end_dim' ({end_dim}) for a tensor of {x.ndim} dims; accepted: "
                         f"start_dim <= end_dim")
    shape = tuple(x.shape)
    return _reshape("flatten", x, shape[:start] + (math.prod(shape[start:end + 1]),)
                    + shape[end + 1:])


@defop(method=True)
def unsqueeze(x, dim: int):
    """Insert a dim of size 1 at ``dim`` (``-ndim-1 <= dim <= ndim``); splits follow.

    >>> x.unsqueeze(0)           # (3, 4) -> (1, 3, 4)
    """
    x = _one("unsqueeze", x)
    d = norm_dim("unsqueeze", dim, x.ndim + 1)
    shape = tuple(x.shape)
    return _reshape("unsqueeze", x, shape[:d] + (1,) + shape[d:])


@defop(method=True)
def squeeze(x, dim=None):
    """Remove dims of size 1: all of them (``dim=None``), or those among ``dim`` (an int or
    a tuple; a named dim whose size is not 1 is kept, like PyTorch).

    >>> x.squeeze(1)             # (3, 1, 4) -> (3, 4)
    """
    x = _one("squeeze", x)
    if dim is None:
        dims = set(range(x.ndim))
    else:
        named = dim if isinstance(dim, (tuple, list)) else (dim,)
        dims = {norm_dim("squeeze", d, x.ndim) for d in named}
    shape = tuple(n for i, n in enumerate(x.shape) if not (i in dims and n == 1))
    return _reshape("squeeze", x, shape)


# ----------------------------------------------------------------------------- permute
def _permute_signatures(layouts, dims):
    cands = [sig([B], B)] + [sig([S(d)], S(j)) for j, d in enumerate(dims)]
    return cands + partial_signatures(layouts)


def _inverse(dims: tuple) -> tuple:
    inv = [0] * len(dims)
    for j, d in enumerate(dims):
        inv[d] = j
    return tuple(inv)


def _permute(opname: str, x, dims: tuple):
    if dims == tuple(range(x.ndim)):
        return x
    return permute.op(x, dims=dims)


@defop(kernel=lambda xp, x, dims: xp.transpose(x, dims),
       meta=lambda layouts, dims: [(tuple(layouts[0].shape[d] for d in dims), layouts[0].dtype)],
       signatures=_permute_signatures, view=True, saves=(),
       backward=lambda ctx, g: (permute.op(g, dims=_inverse(ctx.attrs["dims"])),), method=True)
def permute(op, x, *dims):
    """Reorder the dims: output dim ``j`` is input dim ``dims[j]``; a split moves with its
    dim, without communication.

    >>> x.permute(2, 0, 1); ct.permute(x, (2, 0, 1))
    """
    x = _one("permute", x)
    dims = _size_args("permute", "dims", dims)
    if len(dims) != x.ndim:
        raise ValueError(f"permute: argument 'dims' {dims} has {len(dims)} entries but the "
                         f"tensor has {x.ndim} dims; accepted: a permutation of "
                         f"{tuple(range(x.ndim))}")
    norm = tuple(norm_dim("permute", d, x.ndim, "dims") for d in dims) if x.ndim else ()
    if sorted(norm) != list(range(x.ndim)):
        raise ValueError(f"permute: argument 'dims' {dims} repeats a dim; accepted: a "
                         f"permutation of {tuple(range(x.ndim))}")
    return _permute("permute", x, norm)


@defop(method=True)
def transpose(x, dim0: int, dim1: int):
    """Swap two dims; an ``S(dim0)`` input gives ``S(dim1)`` with no communication.

    >>> x.transpose(0, 1); x.transpose(-1, -2)
    """
    x = _one("transpose", x)
    if x.ndim == 0:
        norm_dim("transpose", dim0, 0, "dim0")
        norm_dim("transpose", dim1, 0, "dim1")
        return x
    d0 = norm_dim("transpose", dim0, x.ndim, "dim0")
    d1 = norm_dim("transpose", dim1, x.ndim, "dim1")
    dims = list(range(x.ndim))
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return _permute("transpose", x, tuple(dims))


@defop(method=True)
def t(x):
    """The transpose of a 2-D tensor; 0-D and 1-D tensors come back unchanged (PyTorch's
    ``t()``). A split moves with its dim.

    >>> w.t()                    # (3, 4) -> (4, 3)
    """
    x = _one("t", x)
    if x.ndim > 2:
        raise ValueError(f"t: the input has {x.ndim} dims (shape {tuple(x.shape)}); "
                         f"accepted: tensors with at most 2 dims (use transpose(dim0, dim1) "
                         f"or permute for more)")
    return x if x.ndim < 2 else _permute("t", x, (1, 0))


@defop(method=True)
def contiguous(x):
    """``x`` itself: shards are always usable as they are (kept for PyTorch code)."""
    return x


# ----------------------------------------------------------------------------- flip
def _flip_signatures(layouts, dims):
    (x,) = layouts
    cands = [sig([B], B)] + [sig([S(d)], S(d)) for d in range(x.ndim) if d not in dims]
    return cands + partial_signatures(layouts)


@defop(kernel=lambda xp, x, dims: xp.flip(x, axis=dims),
       meta=lambda layouts, dims: [(tuple(layouts[0].shape), layouts[0].dtype)],
       signatures=_flip_signatures,
       backward=lambda ctx, g: (flip.op(g, dims=ctx.attrs["dims"]),), method=True)
def flip(op, x, dims):
    """Reverse the order of elements along ``dims`` (an int or a tuple). Splits of other
    dims stay local; a split of a flipped dim is gathered first (part ``r`` of the result
    is the mirror of another rank's part).

    >>> x.flip(0); ct.flip(x, (0, 1))
    """
    x = _one("flip", x)
    named = dims if isinstance(dims, (tuple, list)) else (dims,)
    norm = tuple(sorted({norm_dim("flip", d, x.ndim, "dims") for d in named}))
    if len(norm) != len(named):
        raise ValueError(f"flip: argument 'dims' {dims} names a dim twice; accepted: "
                         f"distinct dims")
    if x.ndim == 0 or not norm:
        return x
    return op(x, dims=norm)


# ----------------------------------------------------------------------------- repeat
def _repeat_shape(shape: tuple, sizes: tuple) -> tuple:
    lead = len(sizes) - len(shape)
    return tuple(sizes[:lead]) + tuple(n * r for n, r in zip(shape, sizes[lead:]))


def _repeat_signatures(layouts, sizes):
    (x,) = layouts
    lead = len(sizes) - x.ndim
    # a repeated dim holds whole copies one after another: a shard of the input is not a
    # part of the output under the uneven-split rule, so only dims repeated once keep splits
    cands = [sig([B], B)] + [sig([S(d)], S(d + lead)) for d in range(x.ndim)
                             if sizes[lead + d] == 1]
    return cands + partial_signatures(layouts)


def _repeat_backward(ctx, g):
    """Each input element's gradient is the sum over its copies: view the gradient as
    ``(copies, n)`` per repeated dim and sum over the copies."""
    (x,), sizes = ctx.inputs, ctx.attrs["sizes"]
    lead = len(sizes) - x.ndim
    shape, copies = list(sizes[:lead]), list(range(lead))
    for n, r in zip(x.shape, sizes[lead:]):
        if r != 1:
            copies.append(len(shape))
            shape.append(r)
        shape.append(n)
    g = _reshape("repeat", g, tuple(shape))
    return (OPS.sum(g, dim=tuple(copies)) if copies else g,)


@defop(kernel=lambda xp, x, sizes: xp.tile(x, sizes),
       meta=lambda layouts, sizes: [(_repeat_shape(layouts[0].shape, sizes),
                                     layouts[0].dtype)],
       signatures=_repeat_signatures, backward=_repeat_backward, method=True)
def repeat(op, x, *sizes):
    """Tile ``x``: dim ``d`` repeated ``sizes[d]`` times, extra leading ``sizes`` adding
    new dims (PyTorch's ``repeat``, NumPy's ``tile``; not ``numpy.repeat``).

    >>> x.repeat(2, 1)           # (3, 4) -> (6, 4): the rows twice, one after the other
    >>> x.repeat(2, 1, 1)        # (3, 4) -> (2, 3, 4)
    """
    x = _one("repeat", x)
    sizes = _size_args("repeat", "sizes", sizes)
    if len(sizes) < x.ndim:
        raise ValueError(f"repeat: argument 'sizes' {sizes} has {len(sizes)} entries but the "
                         f"tensor has {x.ndim} dims; accepted: at least {x.ndim} sizes")
    if any(r < 0 for r in sizes):
        raise ValueError(f"repeat: argument 'sizes' {sizes} has a negative entry; "
                         f"accepted: sizes >= 0")
    if len(sizes) == x.ndim and all(r == 1 for r in sizes):
        return x
    return op(x, sizes=sizes)


# ----------------------------------------------------------------------------- expand
def _expand_meta(layouts, shape):
    (x,) = layouts
    lead = len(shape) - x.ndim
    for d, n in enumerate(x.shape):
        if n != 1 and n != shape[lead + d]:
            raise ValueError(f"expand: the input of shape {tuple(x.shape)} cannot be expanded "
                             f"to {tuple(shape)} (dim {d} has size {n}); accepted: each dim "
                             f"equal to the target or 1")
    return [(tuple(shape), x.dtype)]


def _expand_signatures(layouts, shape):
    (x,) = layouts
    lead = len(shape) - x.ndim
    cands = [sig([B], B)]
    cands += [sig([S(d)], S(lead + d)) for d, n in enumerate(x.shape) if n == shape[lead + d]]
    return cands + partial_signatures(layouts)


def _expand(opname: str, x, sizes: tuple):
    if len(sizes) < x.ndim:
        raise ValueError(f"{opname}: argument 'size' {sizes} has {len(sizes)} dims but the "
                         f"tensor has {x.ndim}; accepted: at least {x.ndim} sizes")
    lead = len(sizes) - x.ndim
    shape = []
    for i, n in enumerate(sizes):
        if n == -1 and i >= lead:
            n = x.shape[i - lead]
        if n < 0:
            raise ValueError(f"{opname}: argument 'size' {sizes} has size {n} at dim {i}; "
                             f"accepted: sizes >= 0, or -1 (keep) on an existing dim")
        shape.append(n)
    shape = tuple(shape)
    for d, n in enumerate(x.shape):
        if n != 1 and n != shape[lead + d]:
            raise ValueError(f"{opname}: the input of shape {tuple(x.shape)} cannot be "
                             f"expanded to {shape} (dim {d} has size {n}); accepted: each "
                             f"dim equal to the target, 1, or -1 in 'size'")
    if shape == tuple(x.shape):
        return x
    return expand.op(x, shape=shape)


@defop(kernel=lambda xp, x, shape, ctx: xp.broadcast_to(x, _local_shape(ctx)).copy(),
       needs_ctx=True, meta=_expand_meta, signatures=_expand_signatures,
       backward=lambda ctx, g: (sum_to(g, ctx.inputs[0].shape),), method=True)
def expand(op, x, *sizes):
    """Broadcast size-1 dims (and new leading dims) to ``sizes``; ``-1`` keeps a dim.

    >>> x.expand(4, -1)          # (1, 3) -> (4, 3)
    """
    x = _one("expand", x)
    return _expand("expand", x, _size_args("expand", "size", sizes))


@defop(method=True)
def broadcast_to(x, shape):
    """``x`` broadcast to ``shape`` (NumPy / PyTorch rules).

    >>> ct.broadcast_to(x, (2, 4, 3))
    """
    x = _one("broadcast_to", x)
    if not isinstance(shape, (tuple, list)):
        shape = (shape,)
    return _expand("broadcast_to", x, int_args("broadcast_to", "shape", shape))
