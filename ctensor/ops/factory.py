"""``Tensor.new_zeros new_ones new_full new_empty new_tensor``: PyTorch's constructors that
take their defaults from an existing tensor.

The new tensor has the source's dtype (PyTorch's rule, whatever the data or fill value)
and placement unless ``dtype=`` / ``placement=`` are given, and is broadcast unless
``sbp=`` is given: it shares nothing with the source but where it lives (so
``x.new_zeros(n)`` of a split ``x`` is a whole replicated tensor, as ``ct.zeros`` would be).
Nothing communicates; ``new_tensor`` checks under MPI, as :func:`ct.tensor` does, that every
rank passed the same data.
"""
from __future__ import annotations

import numpy as np

from .. import creation
from .._args import unpack_sizes
from ..sbp import Broadcast
from ..tensor import Tensor
from ._rules import defop

__all__ = ["new_zeros", "new_ones", "new_full", "new_empty", "new_tensor"]


def _source(opname: str, x) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{opname}: expected a ct.Tensor, got {type(x).__name__}")
    return x


def _filled(opname: str, x, size, fill_value, dtype, placement, sbp, requires_grad):
    x = _source(opname, x)
    shape = unpack_sizes(size)
    return creation.full(shape, fill_value=fill_value, placement=placement or x.placement,
                         sbp=sbp, dtype=x.dtype if dtype is None else dtype,
                         requires_grad=requires_grad)


@defop(method=True)
def new_zeros(x, *size, dtype=None, placement=None, sbp=None, requires_grad: bool = False):
    """Zeros of ``size`` with ``x``'s dtype and placement, broadcast.

    >>> mask = scores.new_zeros(scores.shape[0], dtype=ct.bool)
    """
    return _filled("new_zeros", x, size, 0, dtype, placement, sbp, requires_grad)


@defop(method=True)
def new_ones(x, *size, dtype=None, placement=None, sbp=None, requires_grad: bool = False):
    """Ones of ``size`` with ``x``'s dtype and placement, broadcast."""
    return _filled("new_ones", x, size, 1, dtype, placement, sbp, requires_grad)


@defop(method=True)
def new_empty(x, *size, dtype=None, placement=None, sbp=None, requires_grad: bool = False):
    """A tensor of ``size`` with ``x``'s dtype and placement, broadcast, its values
    unspecified (zeros here: shards are always initialised)."""
    return _filled("new_empty", x, size, 0, dtype, placement, sbp, requires_grad)


@defop(method=True)
def new_full(x, size, fill_value, *, dtype=None, placement=None, sbp=None,
             requires_grad: bool = False):
    """``fill_value`` everywhere, ``size`` a sequence, with ``x``'s dtype (the value is
    cast to it: ``int_tensor.new_full((2,), 2.7)`` holds 2) and placement, broadcast."""
    if not isinstance(size, (tuple, list)):
        raise TypeError(f"new_full: argument 'size' must be a tuple or list of ints, got "
                        f"{size!r}; call x.new_full((2, 3), value)")
    x = _source("new_full", x)
    target = np.dtype(x.dtype if dtype is None else dtype)
    if isinstance(fill_value, (bool, int, float, np.number, np.bool_)) and target.kind in "biu" \
            and not isinstance(fill_value, (bool, np.bool_)):
        if not np.isfinite(fill_value):
            raise ValueError(f"new_full: argument 'fill_value' {fill_value!r} cannot be "
                             f"stored in dtype {target}")
        fill_value = int(fill_value)  # PyTorch truncates a float fill into an integer dtype
    return _filled("new_full", x, tuple(size), fill_value, target, placement, sbp,
                   requires_grad)


@defop(method=True)
def new_tensor(x, data, *, dtype=None, placement=None, sbp=None,
               requires_grad: bool = False):
    """A tensor of the value ``data`` (a number, nested list, NumPy array or ct.Tensor,
    copied) with ``x``'s dtype and placement unless given, broadcast unless given.

    >>> t = logits.new_tensor([0.0, 1.0])          # logits' dtype
    """
    x = _source("new_tensor", x)
    dtype = x.dtype if dtype is None else dtype
    placement = placement or x.placement
    if isinstance(data, Tensor):  # PyTorch: a copy, cut from the graph
        data = data.detach()
        out = data.to_global(placement, sbp if sbp is not None else
                             (Broadcast(),) * placement.ndim)
        out = out.to(dtype).clone()
        if requires_grad:
            out.requires_grad_(True)
        return out
    return creation.tensor(data, placement=placement, sbp=sbp, dtype=dtype,
                           requires_grad=requires_grad)
