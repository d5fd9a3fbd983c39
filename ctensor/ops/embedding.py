"""``embedding(ids, weight)``: a row lookup, and its weight gradient (an index-add).

With a vocabulary-split weight every rank looks up only the ids inside its vocabulary range
(its region comes from the dispatch context) and writes zeros elsewhere, so the partial sum
over ranks *is* the lookup. The weight gradient, ``embedding.grad_weight(ids, grad,
weight)``, adds gradient rows into the rows their ids name; ``weight`` is passed only for
its layout, and its signatures are the transposes of the forward's (the lookup is linear in
the weight), so the forward's weight SBP costs nothing and the gradient comes out in the
weight's own layout (a vocabulary-split weight gets a vocabulary-split gradient).

================= ========================================================================
 op                inputs -> output (1-D)
================= ========================================================================
 embedding         B,B->B; S(d),B->S(d) (ids split); B,S(1)->S(last) (hidden split);
                   B,S(0)->P (vocabulary split); B,P->P
 grad_weight       B,B,B->B; S(d),S(d),B->P; B,S(last),S(1)->S(1); B,B,S(0)->S(0);
                   B,P,B->P; B,B,P->B
================= ========================================================================
"""
from __future__ import annotations

import math

import numpy as np

from ._checks import check_range
from ._rules import B, P, S, defop, sig, transposed_signatures

__all__ = ["embedding", "index_add", "check_int"]


def index_add(xp, out, index, values):
    """``out[index[i]] += values[i]`` with repeated indices accumulating."""
    if xp is np and isinstance(index, tuple) and len(index) == out.ndim > 1 and \
            out.flags.c_contiguous:
        # every coordinate given: one 1-D add.at on flat positions, NumPy's fast path
        # (the generic tuple path is ~2x slower); the same additions in the same order
        try:
            flat = np.ravel_multi_index(index, out.shape)
        except ValueError:  # (a negative or wrapped coordinate: the generic path)
            flat = None
        if flat is not None:
            np.add.at(out.reshape(-1), flat.reshape(-1),
                      np.broadcast_to(values, flat.shape).reshape(-1))
            return out
    if xp is np and _rows_add(out, index, values):
        return out
    if xp is np or hasattr(xp.add, "at"):
        xp.add.at(out, index, values)
    else:  # older CuPy
        import cupyx
        cupyx.scatter_add(out, index, values)
    return out


#: the most flat positions one call of :func:`_rows_add` computes at once (int64: 32 MiB)
_ROWS_CHUNK = 1 << 22


def _rows_add(out, index, values) -> bool:
    """``out[index[i]] += values[i]`` for an integer array ``index`` of rows of ``out`` and
    ``values`` of shape ``index.shape + out.shape[1:]`` as 1-D ``add.at`` calls on flat
    positions, NumPy's fast path (the row form is 2-5x slower). Each element receives its
    additions in the same order, so the bits are the same. False (nothing done) for other
    forms: negative rows, another values shape, a non-contiguous ``out``."""
    if not (isinstance(index, np.ndarray) and index.dtype.kind in "iu" and out.ndim > 1 and
            out.flags.c_contiguous and isinstance(values, np.ndarray) and
            values.shape == index.shape + out.shape[1:] and values.dtype == out.dtype):
        return False
    rows = index.reshape(-1)
    if rows.size == 0:
        return True
    if rows.min() < 0:
        return False
    width = math.prod(out.shape[1:])
    flat_out, flat_values = out.reshape(-1), values.reshape(-1)
    step = max(1, _ROWS_CHUNK // max(width, 1))
    columns = np.arange(width, dtype=np.int64)
    for start in range(0, rows.size, step):  # (in order: the same additions, chunk by chunk)
        part = rows[start:start + step].astype(np.int64)[:, None] * width + columns
        np.add.at(flat_out, part.reshape(-1), flat_values[start * width:(start + step) * width])
    return True


def check_int(opname: str, arg: str, layout) -> None:
    """``TypeError`` unless the input behind ``layout`` holds integers."""
    if layout.dtype.kind not in "iu":
        raise TypeError(f"{opname}: argument '{arg}' must be an integer tensor, got "
                        f"{layout.dtype}")


def _meta(layouts):
    ids, weight = layouts
    check_int("embedding", "input", ids)
    if weight.ndim != 2 or weight.dtype.kind not in "fc":
        raise ValueError(f"embedding: argument 'weight' must be a 2-D floating tensor "
                         f"(num_embeddings, embedding_dim), got shape {tuple(weight.shape)} "
                         f"dtype {weight.dtype}")
    return [(tuple(ids.shape) + (weight.shape[1],), weight.dtype)]


def _signatures(layouts):
    ids, _ = layouts
    cands = [sig([B, B], B)]
    cands += [sig([S(d), B], S(d)) for d in range(ids.ndim)]
    cands += [sig([B, S(1)], S(ids.ndim)), sig([B, S(0)], P), sig([B, P], P)]
    return cands


def _local_ids(xp, opname, ids, lo, hi, size):
    """Position of each id inside the local range [lo, hi) (0 outside it) and whether it is
    inside; ids outside [0, size) raise (on a device: at the next explicit transfer)."""
    check_range(xp, opname, ids, size, lambda a, b: f"{opname}: ids must lie in [0, {size}), "
                f"got values in [{a}, {b}]")
    local = ids - lo
    inside = (local >= 0) & (local < hi - lo)
    return xp.where(inside, local, 0), inside


def _kernel(xp, ids, weight, ctx):
    lo, hi = ctx.in_region(1)[0]
    vocab = ctx.in_layouts[1].shape[0]
    local, inside = _local_ids(xp, "embedding", ids, lo, hi, vocab)
    if hi == lo:
        return xp.zeros(ids.shape + (weight.shape[1],), dtype=weight.dtype)
    rows = weight[local]
    return xp.where(inside[..., None], rows, xp.zeros((), dtype=weight.dtype))


def _grad_weight_kernel(xp, ids, g, weight, ctx):
    (lo, hi), (c0, c1) = ctx.out_region(0)
    vocab = ctx.out_layouts[0].shape[0]
    out = xp.zeros((hi - lo, c1 - c0), dtype=g.dtype)
    local, inside = _local_ids(xp, "embedding", ids, lo, hi, vocab)
    if hi == lo:
        return out
    # every id adds a row, those outside this shard a zero one into row 0: no boolean-mask
    # indexing (a data-dependent shape, a host synchronisation on a GPU)
    return index_add(xp, out, local, xp.where(inside[..., None], g, xp.zeros((), g.dtype)))


def _grad_weight_signatures(layouts):
    ids, _, weight = layouts
    return transposed_signatures(_signatures((ids, weight)), wrt=1, order=(0, "g", 1))


@defop(kernel=_kernel, meta=_meta, signatures=_signatures, needs_ctx=True, saves=(0, 1),
       backward=lambda ctx, g: (None, ctx.op.grads["grad_weight"](ctx.inputs[0], g,
                                                                  ctx.inputs[1])))
def embedding(op, input, weight):  # noqa: A002 - PyTorch's name
    """Rows of ``weight`` (num_embeddings, dim) at the integer ``input`` ids; the result has
    shape ``input.shape + (dim,)``. A vocabulary-split weight (S(0)) is looked up without
    gathering it: each rank fills the rows it holds and the partial sum is the result.

    >>> h = ct.embedding(ids, wte)          # ids B, wte S(0) -> h P
    """
    return op(input, weight)


embedding.op.grad_kernel(
    "grad_weight", _grad_weight_kernel, needs_ctx=True,
    meta=lambda layouts: [(tuple(layouts[2].shape), layouts[2].dtype)],
    signatures=_grad_weight_signatures)
