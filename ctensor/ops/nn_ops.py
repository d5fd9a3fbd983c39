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
* ``layer_norm``: a fused normalisation kernel when no normalised dim is split (a split
  one goes through partial means, two small all-reduces).
* ``softmax_cross_entropy(logits, target)``: per-target loss; fused (one pass forward, one
  backward) when the class dim is not split, else max via P(max), sum-exp via P and the
  target logit via ``pick`` (P), so class-split logits are never gathered.

Signatures (1-D):

================= ========================================================================
 op                inputs -> output
================= ========================================================================
 embedding         B,B->B; S(d),B->S(d) (ids split); B,S(1)->S(last) (hidden split);
                   B,S(0)->P (vocabulary split); B,P->P
 embedding_grad    B,B,B->B; S(d),S(d),B->P; B,S(last),S(1)->S(1); B,B,S(0)->S(0); B,P,B->P
 pick              B,B->B; S(d),S(d)->S(d) (d not last); S(last),B->P; P,B->P
 pick_grad         B,B,B->B; S(d),S(d),S(d)->S(d); B,B,S(last)->S(last); P,B,B->P
 causal_fill       B->B; S(d)->S(d) for every dim d; P->P when the fill value is 0
 softmax (fused)   B->B; S(e)->S(e) for e != dim (a split along dim uses the composite);
                   its grad also P,B->P (linear in the incoming grad)
 layer_norm        B->B; S(e)->S(e) for e before the normalised dims; grad also P,B->P
 cross entropy     B,B->B; S(d),S(d)->S(d) for target dims d; grad also P,B,B->P
================= ========================================================================
"""
from __future__ import annotations

import numpy as np

from ..dispatch import apply, as_tensor, op
from ..registry import OPS, register
from ..sbp import Broadcast, Partial, Split
from ._rules import B, P, S, norm_dim, sig

__all__ = ["embedding", "pick", "causal_fill", "softmax", "log_softmax", "layer_norm",
           "softmax_cross_entropy"]


def _index_add(xp, out, index, values):
    """``out[index[i]] += values[i]`` with repeated indices accumulating."""
    if xp is np or hasattr(xp.add, "at"):
        xp.add.at(out, index, values)
    else:  # older CuPy
        import cupyx
        cupyx.scatter_add(out, index, values)
    return out


def _last_dim_add(xp, out, index, values):
    """``out[..., index[...]] += values[...]`` (one position per row of the last dim), by
    flat fancy indexing (the same code on NumPy and CuPy)."""
    rows = out.reshape(-1, out.shape[-1])  # a view: out is freshly made and contiguous
    flat = index.reshape(-1)
    rows[xp.arange(flat.shape[0]), flat] += values.reshape(-1)
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
def _pick_meta(layouts, ignore_index=None):
    x, index = layouts
    _check_int("pick", "index", index)
    if x.ndim == 0 or tuple(index.shape) != tuple(x.shape[:-1]):
        raise ValueError(f"pick: argument 'index' must have the shape of x without its last "
                         f"dim; x has shape {tuple(x.shape)}, index has shape "
                         f"{tuple(index.shape)}")
    return [(tuple(index.shape), x.dtype)]


def _pick_signatures(layouts, **_):
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


def _check_targets(opname, index, size, ignore_index):
    """Targets must lie in [0, size) unless they equal ``ignore_index``."""
    if ignore_index is None or not index.size:
        return
    bad = ((index < 0) | (index >= size)) & (index != ignore_index)
    if bool(bad.any()):
        raise ValueError(f"{opname}: target ids must lie in [0, {size}) or equal ignore_index "
                         f"{ignore_index}, got {int(index[bad].reshape(-1)[0])}")


def _pick_kernel(xp, x, index, ctx, ignore_index=None):
    _check_targets("pick", index, ctx.in_layouts[0].shape[-1], ignore_index)
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
    values = xp.where(inside, g, xp.zeros((), dtype=g.dtype))
    return _last_dim_add(xp, out, local, values)


op("pick_grad", meta=_pick_grad_meta, signatures=_pick_grad_signatures, needs_ctx=True)(
    _pick_grad_kernel)
op("pick", meta=_pick_meta, signatures=_pick_signatures, needs_ctx=True,
   backward=lambda ctx, g: (apply("pick_grad", [g, ctx.inputs[1], ctx.inputs[0]]), None))(
    _pick_kernel)


@register("pick")
def pick(x, index, ignore_index=None):
    """``x[..., index]`` along the last dim: one value per row; an index outside
    ``[0, x.shape[-1])`` picks 0 (with ``ignore_index`` given, only that value may lie
    outside; others raise ``ValueError``). A class-split ``x`` needs no gather: each rank
    picks what it holds and the result is partial.

    >>> target_logit = ct.pick(logits, target)     # logits S(1) -> P
    """
    x, index = as_tensor([x, index], "pick")
    if ignore_index is None:
        return apply("pick", [x, index])
    return apply("pick", [x, index], ignore_index=int(ignore_index))


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
   signatures=lambda layouts, value, **_: (
       [sig([B], B)] + [sig([S(d)], S(d)) for d in range(layouts[0].ndim)]
       + ([sig([P], P)] if value == 0.0 else [])),  # filling zeros is linear
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
    cands = [sig([B] * n, B)] + [sig([S(e)] * n, S(e))
                                 for e in range(layouts[0].ndim) if e != dim]
    if n == 2:  # the grad kernels (g, y) are linear in g
        cands.append(sig([P, B], P))
    return cands


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


# ----------------------------------------------------------------------------- layer norm
def _normalize(xp, x, ndims, eps):
    axes = tuple(range(x.ndim - ndims, x.ndim))
    mean = xp.mean(x, axis=axes, keepdims=True)
    xc = x - mean
    rstd = 1.0 / xp.sqrt(xp.mean(xc * xc, axis=axes, keepdims=True) + eps)
    return xc * rstd, rstd, axes


def _layer_norm_kernel(xp, x, ndims, eps):
    if x.size == 0:
        return x.copy()
    return _normalize(xp, x, ndims, eps)[0]


def _layer_norm_grad_kernel(xp, g, x, ndims, eps):
    """d/dx of (x - mean) * rstd: rstd * (g - mean(g) - xhat * mean(g * xhat))."""
    if x.size == 0:
        return g.copy()
    xhat, rstd, axes = _normalize(xp, x, ndims, eps)
    return rstd * (g - xp.mean(g, axis=axes, keepdims=True)
                   - xhat * xp.mean(g * xhat, axis=axes, keepdims=True))


def _leading_signatures(layouts, ndims, **_):
    n = len(layouts)
    cands = [sig([B] * n, B)] + [sig([S(e)] * n, S(e))
                                 for e in range(layouts[0].ndim - ndims)]
    if n == 2:  # the grad kernel (g, x) is linear in g
        cands.append(sig([P, B], P))
    return cands


op("layer_norm_grad", meta=_float_meta("layer_norm_grad"), signatures=_leading_signatures)(
    _layer_norm_grad_kernel)
op("layer_norm", meta=_float_meta("layer_norm"), signatures=_leading_signatures,
   backward=lambda ctx, g: (apply("layer_norm_grad", [g, ctx.inputs[0]], **ctx.attrs),))(
    _layer_norm_kernel)


@register("layer_norm")
def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """Normalise over the last ``len(normalized_shape)`` dims (biased variance), then scale
    by ``weight`` and shift by ``bias`` (optional, of ``normalized_shape``).

    One fused kernel when no normalised dim is split (other splits stay local); a split
    normalised dim goes through partial means (two small all-reduces of row statistics).

    >>> y = ct.layer_norm(x, (64,), gamma, beta)
    """
    (x,) = as_tensor([x], "layer_norm")
    shape = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) \
        else tuple(normalized_shape)
    n = len(shape)
    if n == 0 or n > x.ndim or tuple(x.shape[x.ndim - n:]) != shape:
        raise ValueError(f"layer_norm: argument 'normalized_shape' is {shape} but the input "
                         f"has shape {tuple(x.shape)}; accepted: a non-empty tail of the "
                         f"input's shape")
    if x.dtype.kind not in "fc":
        raise TypeError(f"layer_norm: the input must be a floating tensor, got {x.dtype}")
    for arg, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"layer_norm: argument '{arg}' has shape {tuple(t.shape)}, "
                             f"accepted {shape} (normalized_shape)")
    dims = tuple(range(x.ndim - n, x.ndim))
    if not any(_split_along(x, d) for d in dims):
        y = apply("layer_norm", [x], ndims=n, eps=float(eps))
    else:
        xc = x - _reduced(OPS.mean(x, dim=dims, keepdim=True))
        var = _reduced(OPS.mean(xc * xc, dim=dims, keepdim=True))
        y = xc * OPS.rsqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


# ----------------------------------------------------------------------------- cross entropy
def _ce_meta(layouts, ignore_index):
    logits, target = layouts[-2:]
    if logits.dtype.kind != "f":
        raise TypeError(f"softmax_cross_entropy: argument 'logits' must be floating, got "
                        f"{logits.dtype}")
    _check_int("softmax_cross_entropy", "target", target)
    if logits.ndim == 0 or tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"softmax_cross_entropy: target of shape {tuple(target.shape)} does "
                         f"not match logits of shape {tuple(logits.shape)}; accepted: target "
                         f"shape == logits.shape[:-1] (class dim last)")
    return [(tuple(target.shape), logits.dtype)]


def _ce_parts(xp, logits, target, ignore_index):
    _check_targets("cross_entropy", target, logits.shape[-1], ignore_index)
    valid = target != ignore_index
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
    scale = xp.where(valid, g, xp.zeros((), dtype=g.dtype))[..., None]
    out = e * (scale / s)
    return _last_dim_add(xp, out, index, -scale)


def _ce_signatures(layouts, **_):
    n, nd = len(layouts), layouts[-1].ndim  # target: the last input, (...) dims
    cands = [sig([B] * n, B)] + [sig([S(d)] * n, S(d)) for d in range(nd)]
    if n == 3:  # the grad is linear in g
        cands.append(sig([P, B, B], P))
    return cands


op("softmax_cross_entropy_grad",
   meta=lambda layouts, **_: [(tuple(layouts[1].shape), layouts[1].dtype)],
   signatures=_ce_signatures)(_ce_grad_kernel)
op("softmax_cross_entropy", meta=_ce_meta, signatures=_ce_signatures,
   backward=lambda ctx, g: (apply("softmax_cross_entropy_grad", [g, *ctx.inputs],
                                  **ctx.attrs), None))(_ce_kernel)


@register("softmax_cross_entropy")
def softmax_cross_entropy(logits, target, ignore_index: int = -100):
    """Per-target loss ``logsumexp(logits) - logits[target]`` over the last (class) dim, 0
    where ``target == ignore_index``.

    Fused when the class dim is not split (batch splits stay local). Class-split logits are
    never gathered: the max goes through P(max), the sum of exponentials through P and the
    target logit through :func:`pick` (P); only row statistics move.

    >>> loss = ct.softmax_cross_entropy(logits, target).mean()
    """
    logits, target = as_tensor([logits, target], "softmax_cross_entropy")
    ignore_index = int(ignore_index)
    _ce_meta((logits._layout, target._layout), ignore_index)
    if not _split_along(logits, logits.ndim - 1):
        return apply("softmax_cross_entropy", [logits, target], ignore_index=ignore_index)
    m = _reduced(OPS.amax(logits, dim=-1, keepdim=True)).detach()
    z = logits - m
    lse = OPS.log(_reduced(OPS.sum(OPS.exp(z), dim=-1)))
    loss = lse - pick(z, target, ignore_index=ignore_index)
    return OPS.where(target != ignore_index, loss, 0.0)
