"""Rearranging ops written with the shape and indexing ops: ``roll``, ``repeat_interleave``,
``unbind``, ``unflatten``, ``movedim`` / ``moveaxis``, ``expand_as``, ``concat`` /
``concatenate``.

None has a kernel of its own: each is exact as a composite, and its SBP behaviour is that of
the ops it is written with (which need no gradient of their own either):

* ``roll`` along ``d`` is ``cat([x[n-s:], x[:n-s]], d)`` (two slices and a cat): a split of
  another dim stays local; a split of ``d`` is boxed by the slices (each part of the result
  comes from one or two other ranks' parts);
* ``repeat_interleave`` with an int is ``unsqueeze(d + 1) -> expand -> flatten(d, d + 1)``
  (a split of another dim stays local); with a tensor of repeats, a ``gather`` along ``d``
  with the index the repeats give (read once on every rank, as PyTorch reads them on the
  host to size the result);
* ``unbind`` is one basic index per slice, ``unflatten`` a reshape (a split of the
  unflattened dim survives on its leading part when aligned), ``movedim`` a permute (a split
  moves with its dim), ``expand_as`` an expand.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .._args import int_args, unpack_sizes
from ..dispatch import as_tensor
from ..registry import OPS
from ..tensor import Tensor
from ._rules import defop, norm_dim

__all__ = ["roll", "repeat_interleave", "unbind", "unflatten", "movedim", "moveaxis",
           "expand_as", "concat", "concatenate"]


def _one(opname: str, x) -> Tensor:
    return as_tensor([x], opname)[0]


def _ints(opname: str, arg: str, value) -> tuple:
    return int_args(opname, arg, tuple(value) if isinstance(value, (tuple, list)) else (value,))


# ----------------------------------------------------------------------------- roll
def _roll_dim(x, shift: int, d: int):
    n = x.shape[d]
    s = shift % n if n else 0
    if s == 0:
        return x
    return OPS.cat([OPS.narrow(x, d, n - s, s), OPS.narrow(x, d, 0, n - s)], d)


@defop(method=True)
def roll(x, shifts, dims=None):
    """Elements shifted by ``shifts`` along ``dims`` (ints or tuples of one length), those
    pushed past the end coming back at the start; without ``dims`` the flattened tensor is
    rolled and the shape restored (PyTorch's ``roll``).

    >>> x.roll(1, 0); ct.roll(x, (1, -2), (0, 1)); x.roll(3)
    """
    x = _one("roll", x)
    shifts = _ints("roll", "shifts", shifts)
    if dims is None:
        if len(shifts) != 1:
            raise ValueError(f"roll: argument 'shifts' {shifts} has {len(shifts)} entries "
                             f"without 'dims'; accepted: one shift (the flattened tensor is "
                             f"rolled), or as many dims as shifts")
        flat = OPS.reshape(x, -1) if x.ndim != 1 else x
        return OPS.reshape(_roll_dim(flat, shifts[0], 0), tuple(x.shape))
    dims = _ints("roll", "dims", dims)
    if len(dims) != len(shifts):
        raise ValueError(f"roll: arguments 'shifts' {shifts} and 'dims' {dims} differ in "
                         f"length; accepted: one shift per dim")
    for shift, dim in zip(shifts, dims):
        x = _roll_dim(x, shift, norm_dim("roll", dim, x.ndim, "dims"))
    return x


# ----------------------------------------------------------------------------- repeat_interleave
def _repeats_array(repeats, n: int) -> np.ndarray:
    """The repeats as a host array of ``n`` non-negative ints (a tensor is read on every
    rank, as PyTorch reads it on the host)."""
    arr = np.asarray(repeats.numpy() if isinstance(repeats, Tensor) else repeats)
    if arr.dtype.kind not in "iu" or arr.ndim > 1:
        raise TypeError(f"repeat_interleave: argument 'repeats' must be an int or a 1-D "
                        f"integer tensor, got dtype {arr.dtype} and shape {arr.shape}")
    arr = arr.reshape(-1).astype(np.int64)
    if arr.size == 1:
        arr = np.full(n, int(arr[0]), dtype=np.int64)
    if arr.size != n:
        raise ValueError(f"repeat_interleave: argument 'repeats' has {arr.size} entries but "
                         f"the dim has size {n}; accepted: one repeat, or one per element")
    if (arr < 0).any():
        raise ValueError("repeat_interleave: argument 'repeats' has a negative entry; "
                         "accepted: repeats >= 0")
    return arr


@defop(method=True)
def repeat_interleave(x, repeats=None, dim=None, *, output_size=None):
    """Each element repeated ``repeats`` times along ``dim`` (an int, or one count per
    element as a 1-D tensor or list); without ``dim`` the flattened tensor (PyTorch's, and
    NumPy's ``repeat``; not ``Tensor.repeat``, which tiles). ``ct.repeat_interleave(counts)``
    alone repeats ``arange(len(counts))``.

    >>> x.repeat_interleave(2, dim=0)            # rows 0, 0, 1, 1, ...
    >>> ct.repeat_interleave(x, ct.tensor([1, 3]), dim=0)
    """
    if repeats is None:  # repeat_interleave(counts): the indices, each counts[i] times
        counts = _one("repeat_interleave", x)
        n = int(np.prod(counts.shape)) if counts.ndim else 1
        _, index = as_tensor([counts, np.arange(n, dtype=np.int64)], "repeat_interleave")
        return repeat_interleave(index, counts, 0, output_size=output_size)
    x = _one("repeat_interleave", x)
    if dim is None:
        x, d = OPS.reshape(x, -1), 0
    else:
        d = norm_dim("repeat_interleave", dim, x.ndim)
    if x.ndim == 0:
        x = OPS.reshape(x, 1)
    n = x.shape[d]
    if isinstance(repeats, (int, np.integer)) and not isinstance(repeats, bool):
        if repeats < 0:
            raise ValueError(f"repeat_interleave: argument 'repeats' is {repeats}; accepted: "
                             f"repeats >= 0")
        total = n * int(repeats)
        _check_output_size(output_size, total)
        shape = tuple(x.shape)
        wide = OPS.expand(OPS.unsqueeze(x, d + 1),
                          *(shape[:d + 1] + (int(repeats),) + shape[d + 1:]))
        return OPS.reshape(wide, shape[:d] + (total,) + shape[d + 1:])
    counts = _repeats_array(repeats, n)
    _check_output_size(output_size, int(counts.sum()))
    positions = np.repeat(np.arange(n, dtype=np.int64), counts)
    shape = [1] * x.ndim
    shape[d] = positions.size
    target = list(x.shape)
    target[d] = positions.size
    index = np.ascontiguousarray(np.broadcast_to(positions.reshape(shape), target))
    return OPS.gather(x, d, as_tensor([x, index], "repeat_interleave")[1])


def _check_output_size(output_size, total: int) -> None:
    if output_size is not None and int(output_size) != total:
        raise ValueError(f"repeat_interleave: argument 'output_size' is {output_size} but "
                         f"the repeats give {total} elements; accepted: {total} or None")


# ----------------------------------------------------------------------------- unbind
@defop(method=True)
def unbind(x, dim: int = 0) -> tuple:
    """The slices of ``x`` along ``dim``, as a tuple of tensors without that dim.

    >>> rows = x.unbind(0); a, b = ct.unbind(pair, dim=-1)
    """
    x = _one("unbind", x)
    if x.ndim == 0:
        raise ValueError("unbind: the input is 0-d; accepted: tensors with at least 1 dim")
    d = norm_dim("unbind", dim, x.ndim)
    lead = (slice(None),) * d
    return tuple(OPS.getitem(x, lead + (i,)) for i in range(x.shape[d]))


# ----------------------------------------------------------------------------- unflatten
@defop(method=True)
def unflatten(x, dim: int, sizes):
    """Dim ``dim`` split into ``sizes`` (one may be -1): the inverse of ``flatten``.

    >>> x.unflatten(1, (2, -1))         # (4, 6) -> (4, 2, 3)
    """
    x = _one("unflatten", x)
    d = norm_dim("unflatten", dim, x.ndim)
    sizes = int_args("unflatten", "sizes", unpack_sizes((sizes,)))
    if not sizes:
        raise ValueError("unflatten: argument 'sizes' is empty; accepted: one or more sizes")
    n = x.shape[d]
    if sizes.count(-1) == 1:
        known = int(np.prod([s for s in sizes if s != -1]))
        if known == 0 or n % known:
            raise ValueError(f"unflatten: sizes {sizes} cannot split dim {d} of size {n}")
        sizes = tuple(n // known if s == -1 else s for s in sizes)
    if int(np.prod(sizes)) != n:
        raise ValueError(f"unflatten: sizes {sizes} multiply to {int(np.prod(sizes))}, but "
                         f"dim {d} has size {n}; accepted: sizes whose product is {n} (one "
                         f"may be -1)")
    shape = tuple(x.shape)
    return OPS.reshape(x, shape[:d] + tuple(sizes) + shape[d + 1:])


# ----------------------------------------------------------------------------- movedim
def _movedim(opname: str, x, source, destination):
    x = _one(opname, x)
    src = [norm_dim(opname, d, x.ndim, "source") for d in _ints(opname, "source", source)]
    dst = [norm_dim(opname, d, x.ndim, "destination")
           for d in _ints(opname, "destination", destination)]
    if len(src) != len(dst):
        raise ValueError(f"{opname}: arguments 'source' {tuple(src)} and 'destination' "
                         f"{tuple(dst)} differ in length; accepted: one destination per dim")
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ValueError(f"{opname}: 'source' {tuple(src)} or 'destination' {tuple(dst)} "
                         f"repeats a dim; accepted: distinct dims")
    rest = iter(d for d in range(x.ndim) if d not in src)
    placed = dict(zip(dst, src))
    order = tuple(placed[j] if j in placed else next(rest) for j in range(x.ndim))
    return OPS.permute(x, order)


@defop(method=True)
def movedim(x, source, destination):
    """Dims ``source`` (an int or a tuple) moved to positions ``destination``, the others
    keeping their order (a permute: a split moves with its dim).

    >>> x.movedim(0, -1)                # (2, 3, 4) -> (3, 4, 2)
    """
    return _movedim("movedim", x, source, destination)


@defop(method=True)
def moveaxis(x, source, destination):
    """The same as :func:`movedim` (NumPy's name, also PyTorch's)."""
    return _movedim("moveaxis", x, source, destination)


# ----------------------------------------------------------------------------- aliases
@defop(method=True)
def expand_as(x, other):
    """``x.expand(other.shape)``.

    >>> bias.expand_as(scores)
    """
    x = _one("expand_as", x)
    if not isinstance(other, Tensor):
        raise TypeError(f"expand_as: argument 'other' must be a ct.Tensor, got "
                        f"{type(other).__name__}")
    return OPS.expand(x, tuple(other.shape))


@defop()
def concat(tensors: Sequence, dim: int = 0):
    """The same as :func:`cat` (PyTorch's other name).

    >>> ct.concat([a, b], dim=1)
    """
    return OPS.cat(tensors, dim)


@defop()
def concatenate(tensors: Sequence, dim: int = 0):
    """The same as :func:`cat` (NumPy's name, also PyTorch's; ``dim``, not ``axis``)."""
    return OPS.cat(tensors, dim)
