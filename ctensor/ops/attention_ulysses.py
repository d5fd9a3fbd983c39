"""Ulysses attention: the composite of ``attention`` for q, k, v split on the sequence along
one mesh axis (context parallelism) that turns the sequence split into a head split and
back (DeepSpeed-Ulysses), two all-to-alls each way:

* forward — q, k, v packed side by side on the last dim (one local concatenation) go
  ``S(seq) -> S(heads)`` in **one** all-to-all; each rank runs the local kernel on its
  heads for the whole sequence; the output and the log-sum-exp, packed, come back
  ``S(heads) -> S(seq)`` in one more;
* backward — the output's gradient goes ``S(seq) -> S(heads)`` (one all-to-all), the local
  gradient kernel gives dq, dk, dv of the rank's heads, which go back packed in one.

It is written with ops (concatenation, boxing, slices, the kernel on head-split inputs),
so the comm log, a shape-only world and ``ct.plan`` see its all-to-alls as they are; its
own autograd node keeps the head-split inputs and outputs (as many bytes as the sequence
split's) and runs the two backward all-to-alls itself.
"""
from __future__ import annotations

from .. import autograd, executor
from ..registry import OPS
from ..sbp import Split
from ..tensor import Tensor

__all__ = []  # (used by ops/attention.py)


#: the ops forward and backward dispatch (concatenations, slices, the kernels): their
#: overhead is part of the choice's price of Ulysses
OPS_DISPATCHED = 15


def applies(layouts, axis: int) -> bool:
    """Whether Ulysses can serve q, k, v split on the sequence along mesh ``axis``: a head
    dim before the sequence, queries and keys of one length, and no other mesh axis
    splitting the queries' sequence (the head split leaves each rank the whole sequence)
    or the heads (a head split nested inside another axis's is no all-to-all on this
    one)."""
    q, k = layouts[0], layouts[1]
    seq, mesh = q.ndim - 2, q.placement.shape
    return q.ndim >= 3 and q.shape[-2] == k.shape[-2] and not any(
        isinstance(e, Split) and e.dim in (seq - 1, seq) for lay in layouts[:3]
        for a, e in enumerate(lay.sbp) if a != axis and mesh[a] > 1)


def head_split(sbp: tuple, axis: int, dim: int) -> tuple:
    """``sbp`` with mesh ``axis``'s entry the split of ``dim`` (the heads)."""
    sbp = list(sbp)
    sbp[axis] = Split(dim)
    return tuple(sbp)


def _moved(opdef, t: Tensor, sbp: tuple) -> Tensor:
    """``t`` (a temporary of this composite's, or the incoming gradient) boxed to ``sbp``,
    the move named ``opdef`` in the communication log (as dispatch names an op's input
    boxing); nothing is kept on ``t`` (no cached copy, no read-only flags)."""
    return executor.boxed(opdef, t, t._layout.with_sbp(sbp), True)


def _slices(t: Tensor, widths) -> list:
    """``t`` cut along its last dim into parts of ``widths``."""
    out, start = [], 0
    for w in widths:
        out.append(OPS.narrow(t, t.ndim - 1, start, w))
        start += w
    return out


def attention(opdef, q: Tensor, k: Tensor, v: Tensor, axis: int, attrs: dict, key=None):
    """``(output, lse)`` of Ulysses along mesh ``axis`` (q, k, v already laid out for it:
    split on the sequence there, as :func:`applies` accepts elsewhere)."""
    e, ev = k.shape[-1], v.shape[-1]
    heads = q.ndim - 3
    seq_sbp = q.sbp
    hs = head_split(seq_sbp, axis, heads)
    keys = () if key is None else (key,)
    with autograd.no_grad():
        packed = _moved(opdef, OPS.cat([q, k, v], q.ndim - 1), hs)
        qh, kh, vh = _slices(packed, (e, e, ev))
        out_h, lse_h = opdef(qh, kh, vh, *keys, **attrs)
        back = OPS.cat([out_h, OPS.unsqueeze(lse_h, -1)], q.ndim - 1)
        back = _moved(opdef, back, seq_sbp)
        out, lse = _slices(back, (ev, 1))
        lse = OPS.squeeze(lse, q.ndim - 1)
    saved = (qh, kh, vh, out_h, lse_h)
    autograd.record(opdef.name, [q, k, v], [out, lse],
                    lambda grads: _backward(opdef, grads[0], saved, seq_sbp, attrs, keys))
    return out, lse


def _backward(opdef, g, saved, seq_sbp, attrs, keys):
    if g is None:
        return None, None, None
    qh, kh, vh, out_h, lse_h = saved
    e, ev = kh.shape[-1], vh.shape[-1]
    grad_op = opdef.grads["grad"]
    if g.sbp != seq_sbp:  # (where the ring takes it)
        g = OPS.to_global(g, None, seq_sbp)
    gh = _moved(grad_op, g, out_h.sbp)
    del g
    # (each temporary let go as soon as the next one is made: the head-split gradients
    # and their concatenation are three blocks each, the backward's peak)
    packed = OPS.cat(list(grad_op(gh, qh, kh, vh, out_h, lse_h, *keys, **attrs)), qh.ndim - 1)
    del gh
    packed = _moved(grad_op, packed, seq_sbp)
    return tuple(_slices(packed, (e, e, ev)))
