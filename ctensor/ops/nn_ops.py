"""Core ops behind ``ctensor.nn.functional`` that need kernels of their own.

* ``embedding(ids, weight)``: a row lookup. With a vocabulary-split weight every rank looks
  up only the ids inside its vocabulary range (its region comes from the dispatch context)
  and writes zeros elsewhere, so the partial sum over ranks *is* the lookup.
* ``embedding_grad(ids, grad, weight)``: the weight's gradient, an index-add of gradient
  rows. ``weight`` is passed only for its layout: the signature whose weight SBP matches the
  forward's costs nothing, so the gradient comes out in the weight's own layout (a
  vocabulary-split weight gets a vocabulary-split gradient, never a full one).
* ``pick(x, index)``: ``x[..., index]`` along the last dim, with out-of-range indices giving
  0. On a class-split ``x`` each rank picks the indices it holds -> P; cross entropy uses
  it so split logits are never gathered. ``pick_grad`` is its transpose (a scatter).
* ``causal_fill(x, value, diagonal)``: ``x`` with ``value`` above the ``diagonal`` of its
  last two dims, from the shard offsets, so any split of any dim stays local.
* fused ``softmax`` / ``log_softmax`` kernels for dims no mesh axis splits (one pass
  forward and backward instead of a chain of elementwise ops).
* ``linear(x, weight, bias)``: ``x @ weight^T + bias`` without a transpose op.

Signatures (1-D):

================= ========================================================================
 op                inputs -> output
================= ========================================================================
 embedding         B,B->B; S(d),B->S(d) (ids split); B,S(1)->S(last) (hidden split);
                   B,S(0)->P (vocabulary split); B,P->P
 embedding_grad    B,B,B->B; S(d),S(d),B->P; B,S(last),S(1)->S(1); B,B,S(0)->S(0); B,P,B->P
 pick              B,B->B; S(d),S(d)->S(d) (d not last); S(last),B->P; P,B->P
 pick_grad         B,B,B->B; S(d),S(d),S(d)->S(d); B,B,S(last)->S(last); P,B,B->P
 causal_fill       B->B; S(d)->S(d) for every dim d
 softmax (fused)   B->B; S(e)->S(e) for e != dim (a split along dim uses the composite)
================= ========================================================================
"""
from __future__ import annotations

import numpy as np

from ..dispatch import apply, as_tensor, op
from ..registry import OPS, register
from ..sbp import Broadcast, Partial, Split
from ._rules import B, P, S, norm_dim, sig
from .linalg import matmul_t

__all__ = ["embedding", "linear", "pick", "causal_fill", "softmax", "log_softmax"]


def _index_add(xp, out, index, values):
    """``out[index[i]] += values[i]`` with repeated indices accumulating."""
    if xp is np:
        np.add.at(out, index, values)
    else:
        import cupyx
        cupyx.scatter_add(out, index, values)
    return out


def _check_int(opname: str, arg: str, layout) -> None:
    if layout.dtype.kind not in "iu":
        raise TypeError(f"{opname}: argument '{arg}' must be an integer tensor, got "
                        f"{layout.dtype}")


# ----------------------------------------------------------------------------- embedding
def _embedding_meta(layouts):
    ids, weight = layouts
    _check_int("embedding", "input", ids)
    if weight.ndim != 2 or weight.dtype.kind not in "fc":
        raise ValueError(f"embedding: argument 'weight' must be a 2-D floating tensor "
                         f"(num_embeddings, embedding_dim), got shape {tuple(weight.shape)} "
                         f"dtype {weight.dtype}")
    return [(tuple(ids.shape) + (weight.shape[1],), weight.dtype)]


def _embedding_signatures(layouts):
    ids, _ = layouts
    cands = [sig([B, B], B)]
    cands += [sig([S(d), B], S(d)) for d in range(ids.ndim)]
    cands += [sig([B, S(1)], S(ids.ndim)), sig([B, S(0)], P), sig([B, P], P)]
    return cands


def _local_ids(xp, opname, ids, lo, hi, size):
    """Position of each id inside the local range [lo, hi) and whether it is inside."""
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= size):
        raise ValueError(f"{opname}: ids must lie in [0, {size}), got values in "
                         f"[{int(ids.min())}, {int(ids.max())}]")
    local = ids - lo
    inside = (local >= 0) & (local < hi - lo)
    return xp.where(inside, local, 0), inside


def _embedding_kernel(xp, ids, weight, ctx):
    lo, hi = ctx.in_box(1)[0]
    vocab = ctx.in_layouts[1].shape[0]
    local, inside = _local_ids(xp, "embedding", ids, lo, hi, vocab)
    if hi == lo:
        return xp.zeros(ids.shape + (weight.shape[1],), dtype=weight.dtype)
    rows = weight[local]
    return xp.where(inside[..., None], rows, xp.zeros((), dtype=weight.dtype))


def _embedding_grad_meta(layouts):
    _, _, weight = layouts
    return [(tuple(weight.shape), weight.dtype)]


def _embedding_grad_signatures(layouts):
    ids, g, _ = layouts
    cands = [sig([B, B, B], B)]
    cands += [sig([S(d), S(d), B], P) for d in range(ids.ndim)]
    cands += [sig([B, S(ids.ndim), S(1)], S(1)), sig([B, B, S(0)], S(0)), sig([B, P, B], P)]
    return cands


def _embedding_grad_kernel(xp, ids, g, weight, ctx):
    (lo, hi), (c0, c1) = ctx.out_box(0)
    vocab = ctx.out_layouts[0].shape[0]
    out = xp.zeros((hi - lo, c1 - c0), dtype=g.dtype)
    local, inside = _local_ids(xp, "embedding_grad", ids, lo, hi, vocab)
    return _index_add(xp, out, local[inside], g[inside])


op("embedding_grad", meta=_embedding_grad_meta, signatures=_embedding_grad_signatures,
   needs_ctx=True)(_embedding_grad_kernel)
op("embedding", meta=_embedding_meta, signatures=_embedding_signatures, needs_ctx=True,
   backward=lambda ctx, g: (None, apply("embedding_grad", [ctx.inputs[0], g,
                                                            ctx.inputs[1]])))(
    _embedding_kernel)


@register("embedding")
def embedding(input, weight):  # noqa: A002 - PyTorch's name
    """Rows of ``weight`` (num_embeddings, dim) at the integer ``input`` ids; the result has
    shape ``input.shape + (dim,)``. A vocabulary-split weight (S(0)) is looked up without
    gathering it: each rank fills the rows it holds and the partial sum is the result.

    >>> h = ct.embedding(ids, wte)          # ids B, wte S(0) -> h P
    """
    ids, weight = as_tensor([input, weight], "embedding")
    return apply("embedding", [ids, weight])


# ----------------------------------------------------------------------------- pick
def _pick_meta(layouts):
    x, index = layouts
    _check_int("pick", "index", index)
    if x.ndim == 0 or tuple(index.shape) != tuple(x.shape[:-1]):
        raise ValueError(f"pick: argument 'index' must have the shape of x without its last "
                         f"dim; x has shape {tuple(x.shape)}, index has shape "
                         f"{tuple(index.shape)}")
    return [(tuple(index.shape), x.dtype)]


def _pick_signatures(layouts):
    x, _ = layouts
    last = x.ndim - 1
    cands = [sig([B, B], B)]
    cands += [sig([S(d), S(d)], S(d)) for d in range(last)]
    cands += [sig([S(last), B], P), sig([P, B], P)]
    return cands


def _pick_positions(xp, index, lo, hi):
    local = index - lo
    inside = (local >= 0) & (local < hi - lo)
    return xp.where(inside, local, 0)[..., None], inside


def _pick_kernel(xp, x, index, ctx):
    lo, hi = ctx.in_box(0)[-1]
    if hi == lo:
        return xp.zeros(index.shape, dtype=x.dtype)
    local, inside = _pick_positions(xp, index, lo, hi)
    picked = xp.take_along_axis(x, local, axis=-1)[..., 0]
    return xp.where(inside, picked, xp.zeros((), dtype=x.dtype))


def _pick_grad_meta(layouts):
    _, _, x = layouts
    return [(tuple(x.shape), x.dtype)]


def _pick_grad_signatures(layouts):
    _, _, x = layouts
    last = x.ndim - 1
    cands = [sig([B, B, B], B)]
    cands += [sig([S(d), S(d), S(d)], S(d)) for d in range(last)]
    cands += [sig([B, B, S(last)], S(last)), sig([P, B, B], P)]
    return cands


def _pick_grad_kernel(xp, g, index, x, ctx):
    box = ctx.out_box(0)
    lo, hi = box[-1]
    out = xp.zeros(tuple(b - a for a, b in box), dtype=g.dtype)
    if hi == lo:
        return out
    local, inside = _pick_positions(xp, index, lo, hi)
    values = xp.where(inside, g, xp.zeros((), dtype=g.dtype))[..., None]
    xp.put_along_axis(out, local, values, axis=-1)
    return out


op("pick_grad", meta=_pick_grad_meta, signatures=_pick_grad_signatures, needs_ctx=True)(
    _pick_grad_kernel)
op("pick", meta=_pick_meta, signatures=_pick_signatures, needs_ctx=True,
   backward=lambda ctx, g: (apply("pick_grad", [g, ctx.inputs[1], ctx.inputs[0]]), None))(
    _pick_kernel)


@register("pick")
def pick(x, index):
    """``x[..., index]`` along the last dim: one value per row; an index outside
    ``[0, x.shape[-1])`` (such as an ``ignore_index``) picks 0. A class-split ``x`` needs no
    gather: each rank picks what it holds and the result is partial.

    >>> target_logit = ct.pick(logits, target)     # logits S(1) -> P
    """
    x, index = as_tensor([x, index], "pick")
    return apply("pick", [x, index])


# ----------------------------------------------------------------------------- causal mask
def _causal_meta(layouts, value, diagonal):
    (x,) = layouts
    if x.ndim < 2:
        raise ValueError(f"causal_fill: the input needs at least 2 dims, got shape "
                         f"{tuple(x.shape)}")
    return [(tuple(x.shape), x.dtype)]


def _causal_kernel(xp, x, value, diagonal, ctx):
    (r0, r1), (c0, c1) = ctx.in_box(0)[-2:]
    rows = xp.arange(r0, r1)[:, None]
    cols = xp.arange(c0, c1)[None, :]
    return xp.where(cols > rows + diagonal, xp.asarray(value, dtype=x.dtype), x)


op("causal_fill", meta=_causal_meta, needs_ctx=True,
   signatures=lambda layouts, **_: [sig([B], B)] + [sig([S(d)], S(d))
                                                   for d in range(layouts[0].ndim)],
   backward=lambda ctx, g: (apply("causal_fill", [g], value=0.0,
                                  diagonal=ctx.attrs["diagonal"]),))(_causal_kernel)


@register("causal_fill")
def causal_fill(x, value: float = float("-inf"), diagonal: int = 0):
    """``x`` with ``value`` where the column index exceeds the row index plus ``diagonal``
    (over the last two dims): the causal attention mask, computed from each shard's offsets.

    >>> scores = ct.causal_fill(scores)          # -inf above the diagonal
    """
    (x,) = as_tensor([x], "causal_fill")
    return apply("causal_fill", [x], value=float(value), diagonal=int(diagonal))


# ----------------------------------------------------------------------------- linear
@register("linear")
def linear(x, weight, bias=None):
    """``x @ weight^T + bias`` (weight ``(out, in)`` like PyTorch), computed without a
    transpose op: a column-split weight (S(0)) gives an output split on its last dim, a
    row-split weight (S(1)) with an input split on its last dim gives a partial output.

    >>> y = ct.linear(x, w, b)
    """
    y = matmul_t(x, weight, transpose_b=True)
    return y if bias is None else y + bias


# ----------------------------------------------------------------------------- softmax
def _softmax_kernel(xp, x, dim, log):
    if x.size == 0:
        return x.copy()
    z = x - xp.max(x, axis=dim, keepdims=True)
    e = xp.exp(z)
    s = xp.sum(e, axis=dim, keepdims=True)
    return z - xp.log(s) if log else e / s


def _softmax_grad_kernel(xp, g, y, dim, log):
    if log:  # y = log_softmax(x): dx = g - softmax(x) * sum(g)
        return g - xp.exp(y) * xp.sum(g, axis=dim, keepdims=True)
    return y * (g - xp.sum(g * y, axis=dim, keepdims=True))


def _rowwise_signatures(layouts, dim, **_):
    n = len(layouts)
    return [sig([B] * n, B)] + [sig([S(e)] * n, S(e))
                                for e in range(layouts[0].ndim) if e != dim]


def _float_meta(opname):
    def meta(layouts, **_):
        x = layouts[-1]
        if x.dtype.kind not in "fc":
            raise TypeError(f"{opname}: the input must be a floating tensor, got {x.dtype}; "
                            f"convert it with .float()")
        return [(tuple(x.shape), x.dtype)]
    return meta


op("softmax_grad", meta=_float_meta("softmax_grad"), signatures=_rowwise_signatures)(
    _softmax_grad_kernel)
op("softmax", meta=_float_meta("softmax"), signatures=_rowwise_signatures,
   backward=lambda ctx, g: (apply("softmax_grad", [g, ctx.outputs[0]], **ctx.attrs),))(
    _softmax_kernel)


def _reduced(t):
    """A small reduction result with its partial axes made broadcast (so the big split
    tensor it meets keeps its split rather than being made partial for free)."""
    if not t._layout.has_partial:
        return t
    return OPS.to_global(t, None, tuple(Broadcast() if isinstance(s, Partial) else s
                                        for s in t.sbp))


def _split_along(x, dim: int) -> bool:
    return any(isinstance(s, Split) and s.dim == dim for s in x.sbp)


def _softmax(name: str, x, dim: int, log: bool):
    (x,) = as_tensor([x], name)
    if x.dtype.kind not in "fc":
        raise TypeError(f"{name}: the input must be a floating tensor, got {x.dtype}; "
                        f"convert it with .float()")
    dim = norm_dim(name, dim, x.ndim)
    if x.ndim == 0:
        return OPS.zeros_like(x) + (0.0 if log else 1.0) + x * 0.0
    if not _split_along(x, dim):  # one fused pass; other splits stay local
        return apply("softmax", [x], dim=dim, log=log)
    # a split along dim: the max and the sum are reductions over ranks (P(max), P)
    z = x - _reduced(OPS.amax(x, dim=dim, keepdim=True)).detach()
    e = OPS.exp(z)
    s = _reduced(OPS.sum(e, dim=dim, keepdim=True))
    return z - OPS.log(s) if log else e / s


@register("softmax")
def softmax(x, dim: int):
    """``exp(x) / sum(exp(x), dim)``, numerically stable (the max is subtracted).

    A split along other dims stays local (one fused kernel); a split along ``dim`` runs as
    a max (P(max)) and a sum (P) over ranks, never gathering ``x``.

    >>> p = ct.softmax(scores, dim=-1)
    """
    return _softmax("softmax", x, dim, False)


@register("log_softmax")
def log_softmax(x, dim: int):
    """``x - log(sum(exp(x), dim))``, numerically stable; splits as :func:`softmax`.

    >>> logp = ct.log_softmax(logits, dim=-1)
    """
    return _softmax("log_softmax", x, dim, True)
