"""Cross entropy: ``pick`` (one value per row by a target index) and
``softmax_cross_entropy`` (per-target loss over the last, class dim).

* ``pick(x, index)``: ``x[..., index]`` along the last dim, out-of-range indices giving 0.
  On a class-split ``x`` each rank picks the indices it holds -> P, so split logits are
  never gathered. Its gradient kernel ``pick.grad`` (a scatter) has the transposed
  signatures (the pick is linear in ``x``).
* ``softmax_cross_entropy(logits, target)``: one fused pass forward and one backward
  (``softmax_cross_entropy.grad``) when the class dim is not split; class-split logits take
  the composite: the max through P(max), the sum of exponentials through P and the target
  logit through ``pick`` (P) — only row statistics move. The cost model chooses.

================= ========================================================================
 op                inputs -> output (1-D)
================= ========================================================================
 pick              B,B->B; S(d),S(d)->S(d) (d not last); S(last),B->P; P,B->P
 pick.grad         transposed: B,B,B->B; P,B,B->P; S(d),S(d),S(d)->S(d); B,B,S(last)->
                   S(last); B,B,P->B
 cross entropy     B,B->B; S(d),S(d)->S(d) for target dims d; S(last),B->B (composite);
                   its grad also P,B,B->P (linear in the incoming gradient)
================= ========================================================================
"""
from __future__ import annotations

from ..dispatch import as_tensor
from ..registry import OPS
from ._rules import (B, P, S, defop, reduced, row_stats_comm, sig, transposed_signatures,
                     widen, widened)
from ._checks import check_where
from .embedding import check_int

__all__ = ["pick", "softmax_cross_entropy"]


def last_dim_add(xp, out, index, values):
    """``out[..., index[...]] += values[...]`` (one position per row of the last dim), by
    flat fancy indexing (the same code on NumPy and CuPy)."""
    if not out.flags.c_contiguous:  # made from a permuted input: reshape would copy
        out = xp.ascontiguousarray(out)
    rows = out.reshape(-1, out.shape[-1])  # a view of the contiguous out
    flat = index.reshape(-1)
    rows[xp.arange(flat.shape[0]), flat] += values.reshape(-1)
    return out


def _check_targets(xp, opname, index, size, ignore_index):
    """Targets must lie in [0, size) unless they equal ``ignore_index``."""
    if ignore_index is None or not index.size:
        return
    bad = ((index < 0) | (index >= size)) & (index != ignore_index)
    check_where(xp, (opname, size, ignore_index), bad, index, lambda v, _: f"{opname}: target "
                f"ids must lie in [0, {size}) or equal ignore_index {ignore_index}, got {v}")


# ----------------------------------------------------------------------------- pick
def _one_per_row(opname: str, arg: str, x, index) -> list:
    """The meta of an op that takes one integer ``index`` per row of ``x``'s last dim."""
    check_int(opname, arg, index)
    if x.ndim == 0 or tuple(index.shape) != tuple(x.shape[:-1]):
        raise ValueError(f"{opname}: argument '{arg}' of shape {tuple(index.shape)} does not "
                         f"match x of shape {tuple(x.shape)}; accepted: {arg} shape == "
                         f"x.shape[:-1] (one per row of the last, class dim)")
    return [(tuple(index.shape), x.dtype)]


def _pick_meta(layouts, ignore_index=None):
    return _one_per_row("pick", "index", *layouts)


def _pick_signatures(layouts, **_):
    x, _ = layouts
    last = x.ndim - 1
    cands = [sig([B, B], B)]
    cands += [sig([S(d), S(d)], S(d)) for d in range(last)]
    cands += [sig([S(last), B], P), sig([P, B], P)]
    return cands


def _positions(xp, index, lo, hi):
    local = index - lo
    inside = (local >= 0) & (local < hi - lo)
    return xp.where(inside, local, 0)[..., None], inside


def _pick_kernel(xp, x, index, ctx, ignore_index=None):
    _check_targets(xp, "pick", index, ctx.in_layouts[0].shape[-1], ignore_index)
    lo, hi = ctx.in_region(0)[-1]
    if hi == lo:
        return xp.zeros(index.shape, dtype=x.dtype)
    local, inside = _positions(xp, index, lo, hi)
    picked = xp.take_along_axis(x, local, axis=-1)[..., 0]
    return xp.where(inside, picked, xp.zeros((), dtype=x.dtype))


def _pick_grad_kernel(xp, g, index, x, ctx):
    box = ctx.out_region(0)
    lo, hi = box[-1]
    out = xp.zeros(tuple(b - a for a, b in box), dtype=g.dtype)
    if hi == lo:
        return out
    local, inside = _positions(xp, index, lo, hi)
    values = xp.where(inside, g, xp.zeros((), dtype=g.dtype))
    return last_dim_add(xp, out, local, values)


def _pick_grad_signatures(layouts, **_):
    _, index, x = layouts
    return transposed_signatures(_pick_signatures((x, index)), wrt=0, order=("g", 1, 0))


@defop(kernel=_pick_kernel, meta=_pick_meta, signatures=_pick_signatures, needs_ctx=True,
       backward=lambda ctx, g: (ctx.op.grads["grad"](g, ctx.inputs[1], ctx.inputs[0]), None))
def pick(op, x, index, ignore_index=None):
    """``x[..., index]`` along the last dim: one value per row; an index outside
    ``[0, x.shape[-1])`` picks 0 (with ``ignore_index`` given, only that value may lie
    outside; others raise ``ValueError``). A class-split ``x`` needs no gather: each rank
    picks what it holds and the result is partial.

    >>> target_logit = ct.pick(logits, target)     # logits S(1) -> P
    """
    if ignore_index is None:
        return op(x, index)
    return op(x, index, ignore_index=int(ignore_index))


pick.op.grad_kernel("grad", _pick_grad_kernel, needs_ctx=True,
                    meta=lambda layouts: [(tuple(layouts[2].shape), layouts[2].dtype)],
                    signatures=_pick_grad_signatures)


# ----------------------------------------------------------------------------- cross entropy
def _ce_meta(layouts, ignore_index):
    logits, target = layouts[-2:]
    if logits.dtype.kind != "f":
        raise TypeError(f"softmax_cross_entropy: argument 'logits' must be floating, got "
                        f"{logits.dtype}")
    return _one_per_row("softmax_cross_entropy", "target", logits, target)


def _ce_parts(xp, logits, target, ignore_index):
    _check_targets(xp, "cross_entropy", target, logits.shape[-1], ignore_index)
    logits = widen(xp, logits)  # float16: the log-sum-exp in float32
    # out-of-range targets raised above on the host; on a device they raise at the next
    # explicit transfer and count as ignored until then (never an out-of-bounds read)
    valid = (target != ignore_index) & (target >= 0) & (target < logits.shape[-1])
    z = logits - xp.max(logits, axis=-1, keepdims=True)
    e = xp.exp(z)
    s = xp.sum(e, axis=-1, keepdims=True)
    return z, e, s, valid, xp.where(valid, target, 0)[..., None]


def _ce_kernel(xp, logits, target, ignore_index):
    if logits.size == 0:
        return xp.zeros(target.shape, dtype=logits.dtype)
    z, _, s, valid, index = _ce_parts(xp, logits, target, ignore_index)
    loss = xp.log(s[..., 0]) - xp.take_along_axis(z, index, axis=-1)[..., 0]
    return xp.where(valid, loss, xp.zeros((), dtype=logits.dtype))


def _ce_grad_kernel(xp, g, logits, target, ignore_index):
    """(softmax(logits) - onehot(target)) * g per row; ignored rows get 0."""
    if logits.size == 0:
        return xp.zeros(logits.shape, dtype=logits.dtype)
    _, e, s, valid, index = _ce_parts(xp, logits, target, ignore_index)
    g = widen(xp, g)
    scale = xp.where(valid, g, xp.zeros((), dtype=g.dtype))[..., None]
    out = e * (scale / s)
    return last_dim_add(xp, out, index, -scale)


def _ce_signatures(layouts, **_):
    n, nd = len(layouts), layouts[-1].ndim  # target: the last input, (...) dims
    cands = [sig([B] * n, B)] + [sig([S(d)] * n, S(d)) for d in range(nd)]
    if n == 3:  # the grad is linear in g
        cands.append(sig([P, B, B], P))
    else:  # class-split logits: the composite reduces row statistics only
        cands.append(sig([S(nd), B], B, composite=True, comm=_ce_comm))
    return cands


_ce_comm = row_stats_comm(3, lambda logits, attrs: (logits.ndim - 1,))  # max, sum, pick


@widened
def _ce_composite(logits, target, ignore_index):
    """The cross entropy from reductions over ranks (class-split logits stay split)."""
    m = reduced(OPS.amax(logits, dim=-1, keepdim=True)).detach()
    z = logits - m
    lse = OPS.log(reduced(OPS.sum(OPS.exp(z), dim=-1)))
    loss = lse - pick(z, target, ignore_index=ignore_index)
    return OPS.where(target != ignore_index, loss, 0.0)


@defop(kernel=_ce_kernel, meta=_ce_meta, signatures=_ce_signatures, composite=_ce_composite,
       backward=lambda ctx, g: (ctx.op.grads["grad"](g, *ctx.inputs, **ctx.attrs), None))
def softmax_cross_entropy(op, logits, target, ignore_index: int = -100):
    """Per-target loss ``logsumexp(logits) - logits[target]`` over the last (class) dim, 0
    where ``target == ignore_index``.

    Fused when the class dim is not split (batch splits stay local). Class-split logits are
    never gathered: the max goes through P(max), the sum of exponentials through P and the
    target logit through :func:`pick` (P); only row statistics move.

    >>> loss = ct.softmax_cross_entropy(logits, target).mean()
    """
    logits, target = as_tensor([logits, target], "softmax_cross_entropy")
    return op(logits, target, ignore_index=int(ignore_index))


softmax_cross_entropy.op.grad_kernel(
    "grad", _ce_grad_kernel, meta=lambda layouts, **_: [(tuple(layouts[1].shape),
                                                         layouts[1].dtype)],
    signatures=_ce_signatures)
