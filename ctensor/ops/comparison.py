"""Closeness and equality of whole tensors: ``isclose`` (elementwise), ``allclose`` and
``equal`` (Python bools), PyTorch's semantics.

All three are composites of elementwise ops and ``all``: ``isclose`` keeps its inputs'
layout (S(d) -> S(d), elementwise signatures), ``allclose`` / ``equal`` reduce it to one
bool with ``all`` (a split gives P(min), one small all-reduce) and read it on every rank,
so every rank gets the same answer (a collective: call them on every rank).
"""
from __future__ import annotations

import numpy as np

from ..dispatch import as_tensor
from ..registry import OPS
from ..tensor import Tensor
from ._rules import broadcast_shapes, defop

__all__ = ["isclose", "allclose", "equal"]


def _tolerance(opname: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or \
            value < 0:
        raise ValueError(f"{opname}: argument '{name}' is {value!r}; accepted: a number >= 0")
    return float(value)


def _isclose(opname: str, a, b, rtol, atol, equal_nan):
    rtol, atol = _tolerance(opname, "rtol", rtol), _tolerance(opname, "atol", atol)
    a, b = as_tensor([a, b], opname)
    broadcast_shapes(opname, tuple(a.shape), tuple(b.shape))
    if a.dtype.kind == "b" and b.dtype.kind == "b":
        return a == b
    # |a - b| <= atol + rtol |b| (PyTorch's, not symmetric in a and b), equal values always
    # (equal infinities: their difference is nan), nan only with equal_nan
    close = a == b
    if a.dtype.kind in "fc" or b.dtype.kind in "fc":
        within = OPS.abs(a - b) <= atol + rtol * OPS.abs(b)
        close = close | (within & OPS.isfinite(a) & OPS.isfinite(b))
        if equal_nan:
            close = close | (OPS.isnan(a) & OPS.isnan(b))
    elif rtol or atol:
        close = close | (OPS.abs(a - b) <= atol + rtol * OPS.abs(b))
    return close


@defop(method=True)
def isclose(x, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False):
    """Elementwise ``|x - other| <= atol + rtol * |other|`` (equal infinities are close,
    nan only with ``equal_nan``), with broadcasting; a bool tensor in ``x``'s layout.

    >>> ct.isclose(x, y, rtol=1e-3)
    """
    return _isclose("isclose", x, other, rtol, atol, equal_nan)


@defop(method=True)
def allclose(x, other, rtol: float = 1e-05, atol: float = 1e-08,
             equal_nan: bool = False) -> bool:
    """Whether every element of ``x`` is close to ``other`` (see :func:`isclose`): a Python
    bool, the same on every rank.

    >>> assert ct.allclose(out, expected, atol=1e-6)
    """
    return bool(OPS.all(_isclose("allclose", x, other, rtol, atol, equal_nan)).item())


@defop(method=True)
def equal(x, other) -> bool:
    """Whether ``x`` and ``other`` have the same shape and the same values (a Python bool,
    the same on every rank; nan is never equal).

    >>> ct.equal(a, b)
    """
    if not isinstance(x, Tensor) or not isinstance(other, Tensor):
        raise TypeError(f"equal: expected two ct.Tensors, got {type(x).__name__} and "
                        f"{type(other).__name__}")
    if tuple(x.shape) != tuple(other.shape):
        return False
    return bool(OPS.all(x == other).item())
