"""Operands of an op: Python scalars and NumPy arrays as broadcast constants on the tensors'
placement, and the one placement an op's inputs must share (:func:`as_tensor`, used by every
op front before :func:`ctensor.dispatch.apply`)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .arrays import array_module
from .dtypes import scalar_dtype
from .executor import new_tensor
from .layout import Layout
from .placement import Placement
from .runtime import world
from .sbp import Broadcast
from .tensor import TENSOR_TYPES, Tensor

__all__ = ["as_tensor", "same_placement"]


_constants: dict = {}


def _constant(value, placement: Placement, dtype=None) -> Tensor:
    """A Python scalar or array as a broadcast constant on ``placement``. Scalars are cached
    (their shards are read-only, so no in-place update can change a cached constant)."""
    scalar = isinstance(value, (bool, int, float))
    if scalar:
        key = (type(value), value, dtype, placement, world())
        hit = _constants.get(key)
        if hit is not None:
            return hit
    arr = np.asarray(value, dtype=dtype)
    if arr.dtype == object:
        raise TypeError(f"cannot use {value!r} ({type(value).__name__}) as a tensor operand")
    layout = Layout(tuple(arr.shape), arr.dtype, placement, (Broadcast(),) * placement.ndim)

    def shards() -> dict:
        xp = array_module(placement.device)
        made = {}
        for r in world().held_ranks:
            if r in placement:
                a = made[r] = xp.asarray(arr)
                if scalar and xp is np:
                    a.flags.writeable = False
        return made

    out = new_tensor(layout, shards)
    if scalar:
        if len(_constants) > 4096:
            _constants.clear()
        _constants[key] = out
    return out


def same_placement(opname: str, placements: Sequence) -> Placement:
    """The one placement of an op's inputs; ``ValueError`` naming both when they differ."""
    first = placements[0]
    for p in placements[1:]:
        if p != first:
            raise ValueError(f"{opname}: inputs have different placements {first!r} and {p!r}; "
                             f"move one with .to_global(placement=...) first")
    return first


def _rehomed(values: Sequence, tensors: list) -> tuple:
    """A tensor broadcast over every rank of its placement meets tensors on another
    placement of the same ranks and device (a position or mask made without a placement,
    used with a model on a 2-D mesh): it is taken onto theirs, as each rank's own array
    (``boxing_steps._Rehome``, no message). Other mixes are left for the error."""
    def replicated(t):
        return all(type(e) is Broadcast for e in t.sbp)
    homes = [t.placement for t in tensors if not replicated(t)] or \
        [max((t.placement for t in tensors), key=lambda p: p.ndim)]
    home = homes[0]
    if any(p != home for p in homes) or any(
            t.placement.device != home.device or
            sorted(t.placement.rank_list) != sorted(home.rank_list) for t in tensors):
        return values, tensors
    moved = {id(t): t.to_global(placement=home, sbp=(Broadcast(),) * home.ndim)
             for t in tensors if t.placement != home}
    return ([moved.get(id(v), v) for v in values], [moved.get(id(t), t) for t in tensors])


def as_tensor(values: Sequence, opname: str) -> tuple:
    """``values`` as tensors: scalars and arrays among them become broadcast constants on
    the tensors' placement (``None`` stays ``None``); all tensors must share one placement.
    """
    first = None
    for v in values:  # fast path: tensors (Parameters too) on one placement
        if type(v) not in TENSOR_TYPES:
            break
        p = v._layout.placement
        if first is None:
            first = p
        elif p is not first and p != first:
            break
    else:
        if first is not None:
            return tuple(values)
    tensors = [v for v in values if isinstance(v, Tensor)]
    if not tensors:
        raise TypeError(f"{opname}: expected at least one ct.Tensor argument, got "
                        f"{[type(v).__name__ for v in values]}")
    if any(t.placement != tensors[0].placement for t in tensors):
        values, tensors = _rehomed(values, tensors)
    placement = same_placement(opname, [t.placement for t in tensors])
    dtypes = [t.dtype for t in tensors]
    out = []
    for v in values:
        if isinstance(v, Tensor) or v is None:
            out.append(v)
        elif isinstance(v, (bool, int, float, complex, np.generic, np.ndarray, list)):
            out.append(_constant(v, placement, None if isinstance(v, (np.ndarray, list))
                                 else scalar_dtype(v, dtypes, opname)))
        else:
            raise TypeError(f"{opname}: unsupported operand {v!r} ({type(v).__name__}); "
                            f"expected a ct.Tensor, a Python number or a NumPy array")
    return tuple(out)
