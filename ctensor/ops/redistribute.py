"""to_global (differentiable redistribution), the full value, clone and casts.

Backward of ``to_global`` boxes the gradient to the *dual* of the input's SBP on the
input's placement: B <-> P(sum), S(d) stays S(d). (A replicated input's gradient is the
sum of what each replica contributed; a partial input's gradient is the same everywhere.)
"""
from __future__ import annotations

import numpy as np

from .. import autograd, boxing
from ..layout import Layout
from ..placement import Placement
from ..registry import register
from ..runtime import world
from ..sbp import Broadcast, Partial, ReduceOp, normalize_sbp, partial_sum
from ..tensor import Tensor


def _dual(sbp: tuple) -> tuple:
    return tuple(partial_sum if isinstance(s, Broadcast) else
                 Broadcast() if isinstance(s, Partial) else s for s in sbp)


@register("to_global")
def to_global(x: Tensor, placement=None, sbp=None) -> Tensor:
    """Redistribute ``x`` to ``placement`` and ``sbp`` (see :meth:`Tensor.to_global`)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"to_global: expected a ct.Tensor, got {type(x).__name__}")
    if placement is None:
        placement = x.placement
    elif not isinstance(placement, Placement):
        raise TypeError(f"to_global: argument 'placement' must be a ct.placement, got "
                        f"{placement!r} ({type(placement).__name__})")
    placement.check_world(world().size, "to_global")
    if sbp is None:
        if placement.ndim != x.placement.ndim:
            raise ValueError(f"to_global: argument 'sbp' is required when the placement's mesh "
                             f"has {placement.ndim} axes and the tensor's has "
                             f"{x.placement.ndim}")
        sbp = x.sbp
    sbp = normalize_sbp(sbp, placement.ndim, x.ndim, "to_global")
    target = Layout(x.shape, x.dtype, placement, sbp)
    if target == x._layout:
        return x
    y = Tensor(target, boxing.box(x._shards, x._layout, target))
    src_layout = x._layout

    def backward_fn(grads):
        (g,) = grads
        return (to_global(g, src_layout.placement, _dual(src_layout.sbp)),)

    autograd.record("to_global", [x], [y], backward_fn)
    return y


@register("full_value")
def full_value(x: Tensor) -> np.ndarray:
    """The whole logical value as a NumPy array on every rank of the world (collective)."""
    w = world()
    everyone = Placement(x.placement.device, list(range(w.size)))
    if set(x.placement.rank_list) == set(everyone.rank_list):
        everyone = x.placement
    layout = Layout(x.shape, x.dtype, everyone, (Broadcast(),) * everyone.ndim)
    shards = boxing.box(x._shards, x._layout, layout)
    arr = shards[w.held_ranks[0]]
    return arr.get() if hasattr(arr, "get") else np.asarray(arr)


@register("clone")
def clone(x: Tensor) -> Tensor:
    """A copy with fresh buffers (differentiable)."""
    y = Tensor(x._layout, {r: a.copy() for r, a in x._shards.items()})
    autograd.record("clone", [x], [y], lambda grads: (grads[0],))
    return y


@register("to")
def to(x: Tensor, dtype) -> Tensor:
    """Cast to ``dtype`` (differentiable between floating dtypes)."""
    dtype = np.dtype(dtype)
    if dtype == x.dtype:
        return x
    if any(isinstance(s, Partial) and s.op is not ReduceOp.SUM for s in x.sbp) or \
            (x._layout.has_partial and dtype.kind not in "fc"):
        # a cast does not commute with a sum/max of casts: reduce first
        x = to_global(x, sbp=tuple(Broadcast() if isinstance(s, Partial) else s for s in x.sbp))
    layout = Layout(x.shape, dtype, x.placement, x.sbp)
    y = Tensor(layout, {r: a.astype(dtype) for r, a in x._shards.items()})
    src_dtype = x.dtype
    autograd.record("to", [x], [y], lambda grads: (to(grads[0], src_dtype),))
    return y


@register("float")
def to_float(x: Tensor) -> Tensor:
    return to(x, np.float32)


@register("double")
def to_double(x: Tensor) -> Tensor:
    return to(x, np.float64)


@register("copy_")
def copy_(dst: Tensor, src) -> Tensor:
    """Overwrite ``dst``'s values in place with ``src`` (boxed to ``dst``'s layout and cast
    to its dtype); not recorded by autograd. Optimizers and ``load_state_dict`` use it so
    that parameters keep their identity."""
    if not isinstance(dst, Tensor):
        raise TypeError(f"copy_: expected a ct.Tensor, got {type(dst).__name__}")
    if not isinstance(src, Tensor):
        from ..dispatch import as_tensor
        src = as_tensor([dst, src], "copy_")[1]
    if tuple(src.shape) != tuple(dst.shape):
        if src.ndim == 0:
            from .. import creation
            src = creation.full(dst.shape, fill_value=0, placement=dst.placement,
                                dtype=dst.dtype) + src
        else:
            raise ValueError(f"copy_: source shape {tuple(src.shape)} does not match "
                             f"destination shape {tuple(dst.shape)}")
    with autograd.no_grad():
        if src.placement != dst.placement or src.sbp != dst.sbp:
            src = to_global(src, dst.placement, dst.sbp)
        for r, a in dst._shards.items():
            a[...] = src._shards[r]
    dst._version += 1
    return dst
