"""``to_global`` (differentiable redistribution), ``clone`` and casts.

* ``to_global`` is an op with a fixed layout instead of a signature choice: dispatch boxes
  its input to the asked placement and SBP (the one boxing planner) and its kernel returns
  the boxed shard. Its backward boxes the gradient to the *dual* of the input's SBP on the
  input's placement: B <-> P(sum), S(d) stays S(d) (a replicated input's gradient is the
  sum of what each replica contributed; a partial input's gradient is the same everywhere).
* ``clone`` copies every shard (any SBP passes through); ``to(dtype)`` (and ``float``,
  ``double``, ``half``, ``long``, ``int``, ``bool``, ``type_as``) casts each shard —
  a cast commutes with a partial sum only into a floating dtype (P -> P then), never with
  P(max)/P(min) in general, so those inputs are reduced first.
"""
from __future__ import annotations

import numpy as np

from ..dispatch import as_tensor
from ..pending import start
from ..dtypes import to_dtype
from ..layout import Layout
from ..placement import Placement
from ..runtime import world
from ..sbp import dual, normalize_sbp
from ..tensor import Tensor
from ._rules import B, P, PMAX, PMIN, S, defop, sig

__all__ = ["to_global", "clone", "to", "half", "long", "int_", "bool_", "type_as"]


# ----------------------------------------------------------------------------- to_global
def _to_global_layout(layouts, placement, sbp):
    (src,) = layouts
    target = Layout(src.shape, src.dtype, placement, sbp)
    return (target,), (target,)


def _to_global_backward(ctx, g):
    src = ctx.in_layouts[0]
    return (to_global(g, src.placement, dual(src.sbp)),)


@defop(kernel=lambda xp, x, placement, sbp: x, fixed_layout=_to_global_layout, meta=None,
       backward=_to_global_backward, saves=())
def to_global(op, x, placement=None, sbp=None, async_op=False):
    """Redistribute ``x`` to ``placement`` and ``sbp`` (see :meth:`Tensor.to_global`);
    ``async_op=True`` starts the move and returns a :class:`~ctensor.PendingTensor`."""
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
    if not isinstance(async_op, bool):
        raise TypeError(f"to_global: argument 'async_op' must be True or False, got "
                        f"{async_op!r}")
    if async_op:
        return start(op, x, Layout(x.shape, x.dtype, placement, sbp))
    if placement == x.placement and sbp == x.sbp:
        return x
    return op(x, placement=placement, sbp=sbp)


# ----------------------------------------------------------------------------- clone / cast
def _identity_signatures(layouts, **_):
    """Every SBP passes through unchanged (a copy per shard)."""
    return [sig([B], B), sig([P], P), sig([PMAX], PMAX), sig([PMIN], PMIN)] + \
        [sig([S(d)], S(d)) for d in range(layouts[0].ndim)]


@defop(kernel=lambda xp, x: x.copy(), signatures=_identity_signatures,
       meta=lambda layouts: [(layouts[0].shape, layouts[0].dtype)],
       backward=lambda ctx, g: (g,), method=True, saves=())
def clone(op, x):
    """A copy with fresh buffers (differentiable)."""
    return op(x)


def _cast_signatures(layouts, dtype):
    cands = [sig([B], B)] + [sig([S(d)], S(d)) for d in range(layouts[0].ndim)]
    return cands + ([sig([P], P)] if np.dtype(dtype).kind in "fc" else [])


@defop(kernel=lambda xp, x, dtype: x.astype(dtype), signatures=_cast_signatures,
       meta=lambda layouts, dtype: [(layouts[0].shape, np.dtype(dtype))],
       backward=lambda ctx, g: (to(g, ctx.in_layouts[0].dtype),), method=True, saves=())
def to(op, x, dtype):
    """Cast to ``dtype`` (``ct.float32``, ``ct.int64``, a NumPy dtype; differentiable
    between floating dtypes); ``x`` itself when the dtype already matches.

    >>> x.to(ct.float16)
    """
    (x,) = as_tensor([x], "to")
    dtype = to_dtype("to", "dtype", dtype)
    if dtype == x.dtype:
        return x
    return op(x, dtype=dtype)


@defop("float", method=True)
def float_(x):
    """Cast to float32."""
    return to(x, np.float32)


@defop("double", method=True)
def double(x):
    """Cast to float64."""
    return to(x, np.float64)


@defop(method=True)
def half(x):
    """Cast to float16.

    >>> x.half().dtype           # float16
    """
    return to(x, np.float16)


@defop(method=True)
def long(x):
    """Cast to int64 (not differentiable)."""
    return to(x, np.int64)


@defop("int", method=True)
def int_(x):
    """Cast to int32 (not differentiable)."""
    return to(x, np.int32)


@defop("bool", method=True)
def bool_(x):
    """Cast to bool (non-zero is True). ``ct.bool`` is the dtype; the cast is ``x.bool()``
    (or ``x.to(ct.bool)``)."""
    return to(x, np.bool_)


@defop(method=True)
def type_as(x, other):
    """``x`` cast to ``other``'s dtype.

    >>> ids.type_as(logits)
    """
    if not isinstance(other, Tensor):
        raise TypeError(f"type_as: argument 'other' must be a ct.Tensor, got "
                        f"{type(other).__name__}")
    return to(x, other.dtype)
