"""Shared helpers for op declarations: metadata checks and signature builders."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..dispatch import Signature, sig
from ..sbp import Broadcast, Partial, ReduceOp, Split

B = Broadcast()
P = Partial(ReduceOp.SUM)
PMAX = Partial(ReduceOp.MAX)
PMIN = Partial(ReduceOp.MIN)
S = Split


def broadcast_shapes(opname: str, *shapes) -> tuple:
    """NumPy/PyTorch broadcasting of ``shapes``; ``ValueError`` naming the op otherwise."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"{opname}: shapes {', '.join(str(tuple(s)) for s in shapes)} cannot "
                         f"be broadcast together (each dim must match or be 1)") from None


def norm_dim(opname: str, dim, ndim: int, arg: str = "dim") -> int:
    """``dim`` made non-negative; ``ValueError`` naming the op when out of range."""
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"{opname}: argument '{arg}' must be an int, got {dim!r}")
    lo, hi = -max(ndim, 1), max(ndim, 1) - 1
    if not lo <= dim <= hi:
        raise ValueError(f"{opname}: argument '{arg}' is {dim} but the tensor has {ndim} "
                         f"dims; accepted {lo}..{hi}")
    return int(dim) % max(ndim, 1)


def elementwise_signatures(layouts: Sequence, out_shape: tuple, partial: Sequence = ()) -> list:
    """B..->B first (ties prefer no split), then S(d) for each output dim (inputs that
    broadcast along d stay B), then the given partial signatures.

    ``partial``: tuples of input SBPs whose output is P, e.g. ``[(P, P)]`` for add.
    """
    n = len(out_shape)
    cands = [sig([B] * len(layouts), B)]
    for d in range(n):
        ins, any_split = [], False
        for l in layouts:
            k = d - (n - l.ndim)
            if k >= 0 and l.shape[k] == out_shape[d]:
                ins.append(S(k))
                any_split = True
            else:
                ins.append(B)
        if any_split:
            cands.append(sig(ins, S(d)))
    for ins in partial:
        cands.append(sig(list(ins), P))
    return cands


def result_dtype(opname: str, dtypes: Sequence) -> np.dtype:
    try:
        return np.result_type(*dtypes)
    except TypeError:
        raise TypeError(f"{opname}: no common dtype for {[str(d) for d in dtypes]}") from None


__all__ = ["B", "P", "PMAX", "PMIN", "S", "Signature", "sig", "broadcast_shapes", "norm_dim",
           "elementwise_signatures", "result_dtype"]
