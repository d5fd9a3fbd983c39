"""``attention``: the fused scaled dot-product attention core, ``softmax(q k^T * scale) v``
over the last two dims of ``q (..., L, E)``, ``k (..., S, E)``, ``v (..., S, Ev)``.

One kernel (:mod:`ctensor.ops._flash`: blockwise scores, online softmax) whose second
output, the log-sum-exp of each query row, is what the backward keeps instead of the
probabilities: activations O(L·E), never the (L, S) scores. Signatures (1-D; inputs
q, k, v -> outputs, lse), chosen by cost per mesh axis:

========================== ==============================================================
 B, B, B -> B, B           every rank the whole attention
 S(d), S(d), S(d) -> S(d)  a batch or head dim (d < ndim-2): local
 S(L), B, B -> S(L)        queries split on the sequence, keys and values whole: local, the
                           causal mask from the shard's offsets (gathering k and v)
 S(L), S(L), S(L) -> S(L)  a composite, the ring or Ulysses (the cheaper by the cost
                           model; ``cp_scheme=`` names one). The ring
                           (:mod:`ctensor.ops.attention_ring`): each rank passes its
                           key/value block to the next on the mesh axis while computing
                           with the current one; the backward is the ring reversed, the
                           key/value gradients travelling with the blocks: ``cp - 1``
                           transfers each way. Ulysses
                           (:mod:`ctensor.ops.attention_ulysses`): q, k, v packed turned
                           into a head split by one all-to-all, the output back by one;
                           the backward their duals
========================== ==============================================================

Where Ulysses applies (a head dim, one length for queries and keys, no other mesh axis
splitting the sequence or the heads) the head-split rule is not offered for inputs split
on the sequence: that move is Ulysses' composite (one packed all-to-all, not three). The
cost model weighs the ring (overlapped point-to-point transfers), Ulysses (four
all-to-alls, its heads' whole sequence computed) and the gather by sequence length, heads
and the axis size.

``causal`` masks key positions after the query's (top-left, as PyTorch); ``dropout=p`` drops
probabilities with the composite's bits (a key input, broadcast, carries the random call).
``zigzag=c``: the
sequence is stored in the zig-zag order of ``c`` ranks (``ct.zigzag_index``): causal masks
use the true positions, so a sequence split ``c`` ways gives every rank equal work.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .. import cost
from ..dispatch import as_tensor
from ..registry import OPS
from ..sbp import Split, format_sbp
from ..executor import new_tensor
from ..layout import Layout
from ..random import next_key
from ._flash import attend, dropper, grad_block, grad_one, positions
from .attention_ring import attention as ring_attention
from .attention_ulysses import OPS_DISPATCHED, applies as ulysses_applies, head_split
from .attention_ulysses import attention as ulysses_attention
from ._rules import B, P, S, defop, sig, widen

__all__ = ["attention", "zigzag_index"]


def _meta(layouts, causal, scale, zigzag, dropout=0.0, cp_scheme=None):
    q, k, v = layouts[:3]
    fn = "attention"
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.dtype.kind != "f":
            raise TypeError(f"{fn}: argument '{name}' must be a floating tensor, got "
                            f"{t.dtype}; convert it with .float()")
        if t.ndim < 2:
            raise ValueError(f"{fn}: argument '{name}' needs at least 2 dims (..., L, E), got "
                             f"shape {tuple(t.shape)}")
    if not (q.ndim == k.ndim == v.ndim) or q.shape[:-2] != k.shape[:-2] or \
            k.shape[:-2] != v.shape[:-2] or q.shape[-1] != k.shape[-1] or \
            k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{fn}: shapes query {tuple(q.shape)}, key {tuple(k.shape)}, value "
                         f"{tuple(v.shape)} do not fit; accepted: query (..., L, E), key "
                         f"(..., S, E), value (..., S, Ev) with the same leading dims "
                         f"(repeat grouped key/value heads first)")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{fn}: query, key and value must have one dtype, got {q.dtype}, "
                        f"{k.dtype}, {v.dtype}; cast them with .to()")
    if zigzag and (q.shape[-2] != k.shape[-2] or q.shape[-2] % (2 * zigzag)):
        raise ValueError(f"{fn}: zigzag={zigzag} needs query and key of one length divisible "
                         f"by {2 * zigzag} (2 chunks per rank), got {q.shape[-2]} and "
                         f"{k.shape[-2]}; pad the sequence or pass zigzag=0")
    return [(q.shape[:-1] + (v.shape[-1],), q.dtype), (q.shape[:-1], q.dtype)]


def _seq_pos(ctx, i: int, zigzag: int) -> np.ndarray:
    """The true positions of input ``i``'s shard along its sequence dim."""
    a, b = ctx.in_region(i)[-2]
    return positions(ctx.in_layouts[i].shape[-2], zigzag)[a:b]


def _drop(xp, key, dropout, ctx, qi: int, ki: int, dtype):
    """The kernel's dropout factors (None without dropout): see ``_flash.dropper``."""
    if not dropout:
        return None
    ql, kl = ctx.in_layouts[qi], ctx.in_layouts[ki]
    qr, kr = ctx.in_region(qi), ctx.in_region(ki)
    return dropper(xp, (int(key[0]), int(key[1])), dropout, ql.shape[:-1] + (kl.shape[-2],),
                   qr[:-2], qr[-2][0], kr[-2][0], dtype)


def _kernel(xp, q, k, v, *key, causal, scale, zigzag, ctx, dropout=0.0, cp_scheme=None):
    drop = _drop(xp, key[0] if key else None, dropout, ctx, 0, 1, q.dtype)
    q, k, v = widen(xp, q, k, v)
    return attend(xp, q, k, v, _seq_pos(ctx, 0, zigzag), _seq_pos(ctx, 1, zigzag),
                  causal, scale, q.dtype, drop)


def _grad_kernel(xp, g, q, k, v, out, lse, *key, causal, scale, zigzag, ctx, dropout=0.0,
                 cp_scheme=None):
    drop = _drop(xp, key[0] if key else None, dropout, ctx, 1, 2, q.dtype)
    g, q, k, v, out, lse = widen(xp, g, q, k, v, out, lse)
    delta = (g * out).sum(axis=-1)
    qpos, kpos = _seq_pos(ctx, 1, zigzag), _seq_pos(ctx, 2, zigzag)
    grads = grad_one(xp, q, k, v, g, lse, delta, qpos, kpos, causal, scale, q.dtype, drop)
    if grads is not None:
        return grads
    dq, dk, dv = xp.zeros_like(q), xp.zeros_like(k), xp.zeros_like(v)
    grad_block(xp, q, k, v, g, lse, delta, qpos, kpos, causal, scale, dq, dk, dv, drop)
    return dq, dk, dv


def _flops(ins, outs, causal, zigzag=0, **_):
    """FLOPs of one shard's kernel on the busiest rank: causal, a query block shorter than
    the keys is the sequence's last (it sees ``len(q) * len(k) - len(q)**2 / 2`` pairs; the
    first block sees only its diagonal) unless the zig-zag order balances the ranks."""
    q, k, v = ins[:3]
    rows = int(np.prod(q[:-1], dtype=np.int64))
    work = 2.0 * rows * k[-2] * (q[-1] + v[-1]) + 5.0 * rows * k[-2]  # (exp, max, sum)
    if not causal:
        return work
    nq, nk = q[-2], k[-2]
    if zigzag or nq >= nk or nk == 0:
        return work / 2
    return work * (1.0 - nq / (2.0 * nk))


def _grad_flops(ins, outs, causal, zigzag=0, **_):
    return 2.5 * _flops(ins[1:4], outs, causal, zigzag)


def _split_all(layouts, axis: int, dim: int) -> bool:
    return all(isinstance(l.sbp[axis], Split) and l.sbp[axis].dim == dim for l in layouts)


def _ring_axis(layouts):
    """The mesh axis the ring runs on: the first one splitting q, k and v on the
    sequence (None without one)."""
    dim = layouts[0].ndim - 2
    return next((a for a in range(layouts[0].placement.ndim)
                 if _split_all(layouts[:3], a, dim)), None)


def _axis(layout, axis: int) -> tuple:
    """``(placement, ranks on mesh axis, the first rank)`` of ``layout`` (the first rank
    holds the largest part under the uneven rule: the one the prices read)."""
    p = layout.placement
    return p, p.shape[axis], p.rank_list[0]


def _ring_comm(layouts, axis, causal, zigzag=0, **_):
    """Seconds the ring adds to the charge of one block on this axis (forward and
    backward), on its busiest rank: ``n - 1`` more blocks computed, each overlapping the
    transfer of the next key/value block (``n - 1`` of them); backward ``n - 1`` hops of
    the block with its gradient accumulators (the last of the accumulators alone), each
    overlapping a ``1 / (n - 1)`` piece of the rank's own block's backward. Causal in the
    natural order the last rank sees each earlier block whole; the zig-zag order
    (``zigzag = n``) gives every rank the causal average."""
    q, k, v = layouts[:3]
    p, n, first = _axis(q, axis)
    if n == 1:
        return 0.0
    block = k.local_nbytes(first) + v.local_nbytes(first)
    shapes = [l.local_shape(first) for l in (q, k, v)]
    fwd = cost.compute(p.device, 0.0, _flops(shapes, (), causal and zigzag == n, zigzag))
    send = cost.collective("send_recv", 2, 2 * block, p.device)
    hidden = 2.5 * fwd / (n - 1)  # (the backward's compute: 2.5 times the forward's)
    back = sum(max(0.0, cost.collective("send_recv", 2, (2 if s == n - 2 else 4) * block,
                                        p.device) - hidden) for s in range(n - 1))
    return (n - 1) * max(fwd, send) + back


def _ulysses_comm(layouts, axis, causal, **_):
    """Seconds Ulysses adds to the charge of one block on this axis: the rank's heads over
    the whole sequence computed instead of one block, four all-to-alls (forward q, k, v
    packed in one and the output with its log-sum-exp back; backward the output's gradient
    in, dq, dk, dv packed back), the packing's copies and the ops it dispatches beyond the
    one every candidate pays (the ring's are inside its one)."""
    q, k, v = layouts[:3]
    p, n, first = _axis(q, axis)
    if n == 1:
        return 0.0
    heads = q.ndim - 3
    block = [l.local_shape(first) for l in (q, k, v)]
    split = [l.with_sbp(head_split(l.sbp, axis, heads)).local_shape(first) for l in (q, k, v)]
    extra = (cost.compute(p.device, 0.0, _flops(split, (), causal))
             - cost.compute(p.device, 0.0, _flops(block, (), causal)))
    qkv = float(sum(l.local_nbytes(first) for l in (q, k, v)))
    rows = q.local_nbytes(first) / q.shape[-1]  # (bytes per element times query rows)
    out = rows * (v.shape[-1] + 1)
    a2a = functools.partial(cost.collective, "all_to_all", n, device=p.device)
    packing = cost.compute(p.device, 2 * (2 * qkv + out))  # (three concatenations)
    return extra + 2 * a2a(nbytes=qkv) + a2a(nbytes=out) + a2a(nbytes=out - rows) + \
        packing + cost.dispatch(p.device, OPS_DISPATCHED)


#: the composites that serve q, k, v split on the sequence (``cp_scheme=``)
CP_SCHEMES = ("ring", "ulysses")


def _priced_scheme(layouts, axis, causal, cp_scheme=None, zigzag=0) -> tuple:
    """``(scheme, seconds)``: the composite for ``layouts`` on ``axis`` and its price —
    ``cp_scheme`` when given, else the cheaper of ``"ring"`` and ``"ulysses"`` (the ring
    where Ulysses does not apply)."""
    if cp_scheme == "ulysses" or (cp_scheme is None and ulysses_applies(layouts, axis)):
        ulysses = _ulysses_comm(layouts, axis, causal)
        if cp_scheme == "ulysses":
            return "ulysses", ulysses
        ring = _ring_comm(layouts, axis, causal, zigzag)
        return ("ring", ring) if ring <= ulysses else ("ulysses", ulysses)
    return "ring", _ring_comm(layouts, axis, causal, zigzag)


def _scheme(layouts, axis, causal, cp_scheme=None, zigzag=0) -> str:
    """The composite :func:`_priced_scheme` picks."""
    if cp_scheme is not None:
        return cp_scheme
    return _priced_scheme(layouts, axis, causal, None, zigzag)[0]


def _cp_comm(layouts, axis, causal, cp_scheme=None, zigzag=0, **_):
    """The seconds of the composite :func:`_priced_scheme` picks (the ring's or Ulysses')."""
    return _priced_scheme(layouts, axis, causal, cp_scheme, zigzag)[1]


def _signatures(layouts, causal, scale, zigzag, dropout=0.0, cp_scheme=None, mesh_axis=0):
    q = layouts[0]
    seq = q.ndim - 2
    key = [B] * (len(layouts) - 3)  # the dropout key: every rank the same
    out = (B, B)
    cp = _ring_axis(layouts) == mesh_axis
    if cp and cp_scheme is not None:  # named: that composite, nothing else, on this axis
        if cp_scheme == "ulysses" and not ulysses_applies(layouts, mesh_axis):
            raise ValueError(
                "attention: cp_scheme='ulysses' needs a head dim before the sequence, query "
                "and key of one length and no other mesh axis splitting the sequence or the "
                f"heads; got shapes {tuple(q.shape)}, {tuple(layouts[1].shape)} laid out "
                f"{[format_sbp(l.sbp) for l in layouts[:3]]}; pass cp_scheme='ring' or None")
        return [sig([S(seq)] * 3 + key, (S(seq), S(seq)), composite=True, comm=_cp_comm)]
    cands = [sig([B] * 3 + key, out)]
    # (q, k, v split on the sequence here: the head split is Ulysses' composite, one
    # packed all-to-all, not three boxings)
    cands += [sig([S(d)] * 3 + key, (S(d), S(d))) for d in range(seq)
              if not (cp and ulysses_applies(layouts, mesh_axis))]
    cands.append(sig([S(seq), B, B] + key, (S(seq), S(seq))))
    if cp:
        cands.append(sig([S(seq)] * 3 + key, (S(seq), S(seq)), composite=True,
                         comm=_cp_comm))
    return cands


def _grad_signatures(layouts, **_):
    seq = layouts[1].ndim - 2
    key = [B] * (len(layouts) - 6)
    cands = [sig([B] * 6 + key, (B, B, B))]
    cands += [sig([S(d)] * 6 + key, (S(d),) * 3) for d in range(seq)]
    cands.append(sig([S(seq), S(seq), B, B, S(seq), S(seq)] + key, (S(seq), P, P)))
    return cands


def _grad_meta(layouts, **_):
    return [(tuple(l.shape), l.dtype) for l in layouts[1:4]]


def _composite(q, k, v, *key, causal, scale, zigzag, dropout=0.0, cp_scheme=None):
    """The ring or Ulysses (:func:`_scheme`): on its axis q, k, v stay split on the
    sequence; on the other axes a batch or head split the three share stays, a sequence
    split of q stays (k and v whole there) and anything else is made whole."""
    axis = _ring_axis((q._layout, k._layout, v._layout))
    seq = q.ndim - 2
    want = [[], [], []]
    for a, (eq, ek, ev) in enumerate(zip(q.sbp, k.sbp, v.sbp)):
        if a == axis:
            entries = (S(seq),) * 3
        elif isinstance(eq, Split) and eq == ek == ev and eq.dim < seq:
            entries = (eq,) * 3
        elif isinstance(eq, Split) and eq.dim == seq:
            entries = (eq, B, B)
        else:
            entries = (B, B, B)
        for w, e in zip(want, entries):
            w.append(e)
    scheme = _scheme((q._layout, k._layout, v._layout), axis, causal, cp_scheme, zigzag)
    q, k, v = [t if tuple(t.sbp) == tuple(w) else OPS.to_global(t, None, tuple(w))
               for t, w in zip((q, k, v), want)]
    if scheme == "ulysses":
        attrs = dict(causal=causal, scale=scale, zigzag=zigzag)
        if key:
            attrs["dropout"] = dropout
        return ulysses_attention(attention.op, q, k, v, axis, attrs, key[0] if key else None)
    return ring_attention(attention.op, q, k, v, axis, causal, scale, zigzag, dropout,
                          key[0] if key else None)


def _backward(ctx, g, g_lse):
    none = (None,) * len(ctx.inputs)
    if g is None:
        return none
    out, lse = ctx.outputs
    return ctx.op.grads["grad"](g, *ctx.inputs[:3], out, lse, *ctx.inputs[3:],
                                **ctx.attrs) + none[3:]


@defop(kernel=_kernel, meta=_meta, signatures=_signatures, needs_ctx=True, n_outputs=2,
       composite=_composite, backward=_backward, flops=_flops, per_axis=True)
def attention(op, query, key, value, causal: bool = False, scale=None, zigzag: int = 0,
              dropout: float = 0.0, cp_scheme=None):
    """The attention core ``softmax(query @ key^T * scale) @ value`` (``query (..., L,
    E)``, ``key (..., S, E)``, ``value (..., S, Ev)``, typically (B, H, T, D)), fused:
    the (L, S) scores are never held whole, the backward recomputes them from the saved
    log-sum-exp. ``scale`` defaults to ``1/sqrt(E)``; ``causal`` masks key positions after
    the query's. Batch- or head-split inputs run locally; inputs split on the sequence run
    as a ring over that mesh axis (or are turned into a head split, or have their keys
    gathered, as the cost model picks). ``zigzag=c``: the sequence is stored in the
    zig-zag order of ``c`` ranks (see :func:`zigzag_index`), so that causal work is
    balanced when it is split ``c`` ways. ``dropout=p`` drops probabilities after the
    softmax with the bits ``ct.rand_like(probabilities) >= p`` would give (one random call,
    drawn block by block by logical position: the same mask on every layout, and the same
    as the composite softmax-dropout-matmul). ``cp_scheme``: for q, k, v split on the
    sequence, ``"ring"`` or ``"ulysses"`` serves them on that mesh axis (default None:
    the cost model picks among those and gathering k and v).

    >>> y = ct.attention(q, k, v, causal=True)
    >>> y = ct.attention(q, k, v, causal=True, cp_scheme="ulysses")
    """
    q, k, v = as_tensor([query, key, value], "attention")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"attention: argument 'causal' must be True or False, got {causal!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.ndim and q.shape[-1] else 1.0
    if isinstance(zigzag, bool) or not isinstance(zigzag, (int, np.integer)) or zigzag < 0:
        raise ValueError(f"attention: argument 'zigzag' must be an int >= 0 (0: the natural "
                         f"order), got {zigzag!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or \
            not 0.0 <= dropout < 1.0:
        raise ValueError(f"attention: argument 'dropout' must be a probability in [0, 1), "
                         f"got {dropout!r}")
    if cp_scheme is not None and cp_scheme not in CP_SCHEMES:
        raise ValueError(f"attention: argument 'cp_scheme' must be None (the cost model "
                         f"picks), 'ring' or 'ulysses', got {cp_scheme!r}")
    attrs = dict(causal=bool(causal), scale=float(scale), zigzag=int(zigzag))
    if cp_scheme is not None:
        attrs["cp_scheme"] = cp_scheme
    if not dropout:
        return op(q, k, v, **attrs)[0]
    # the probabilities' dropout, drawn as ct.rand_like(probabilities) would draw it (one
    # random call): its key travels as a tiny broadcast input (an attribute would make
    # every call a new plan)
    seed, call = next_key()
    layout = Layout((2,), np.dtype(np.uint64), q.placement, (B,) * q.placement.ndim)
    key_t = new_tensor(layout, lambda: {r: np.array([seed, call], np.uint64)
                                        for r in q._shards})
    return op(q, k, v, key_t, dropout=float(dropout), **attrs)[0]


attention.op.grad_kernel("grad", _grad_kernel, meta=_grad_meta, signatures=_grad_signatures,
                         needs_ctx=True, n_outputs=3, flops=_grad_flops)


def zigzag_index(n: int, parts: int) -> np.ndarray:
    """The zig-zag order of a sequence of ``n`` for ``parts`` ranks (``n`` a multiple of
    ``2 * parts``): ``x[..., zigzag_index(n, c), :]`` stores the sequence so that the
    ``i``-th of ``c`` equal parts holds chunks ``i`` and ``2c-1-i`` of ``2c``; causal
    attention with ``zigzag=c`` then gives every rank of a ``c``-way sequence split the
    same work. Its inverse is ``np.argsort(zigzag_index(n, c))``.

    >>> idx = ct.zigzag_index(8, 2)          # [0 1 6 7 2 3 4 5]
    """
    if n % (2 * parts):
        raise ValueError(f"zigzag_index: n ({n}) must be a multiple of 2 * parts "
                         f"({2 * parts})")
    return positions(n, parts)
