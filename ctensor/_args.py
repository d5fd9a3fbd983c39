"""Argument helpers shared by constructors and ops: pure, no tensors, no communication."""
from __future__ import annotations

import operator

import numpy as np

__all__ = ["unpack_sizes", "int_args", "norm_dim"]


def unpack_sizes(sizes: tuple) -> tuple:
    """Accept ``f(2, 3)`` and ``f((2, 3))`` / ``f([2, 3])`` alike: the sizes as a tuple."""
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        return tuple(sizes[0])
    return tuple(sizes)


def int_args(opname: str, arg: str, values) -> tuple:
    """``values`` as a tuple of Python ints; ``TypeError`` naming the op otherwise."""
    out = []
    for v in values:
        if isinstance(v, bool):
            raise TypeError(f"{opname}: argument '{arg}' must hold ints, got {v!r} (bool)")
        try:
            out.append(operator.index(v))
        except TypeError:
            raise TypeError(f"{opname}: argument '{arg}' must hold ints, got {v!r} "
                            f"({type(v).__name__})") from None
    return tuple(out)


def norm_dim(opname: str, dim, ndim: int, arg: str = "dim") -> int:
    """``dim`` made non-negative; ``ValueError`` naming the op when out of range."""
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"{opname}: argument '{arg}' must be an int, got {dim!r}")
    lo, hi = -max(ndim, 1), max(ndim, 1) - 1
    if not lo <= dim <= hi:
        raise ValueError(f"{opname}: argument '{arg}' is {dim} but the tensor has {ndim} "
                         f"dims; accepted {lo}..{hi}")
    return int(dim) % max(ndim, 1)

