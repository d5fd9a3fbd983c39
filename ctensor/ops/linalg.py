"""Matrix products: ``matmul`` (``a @ b``) with NumPy batching and 1-D operands.

One op, ``matmul``, with two internal attributes ``transpose_a`` / ``transpose_b`` (swap the
last two dims of a >= 2-D operand before the product) so that backward passes and
``linear`` need no separate transpose op. Its SBP rules come from an einsum-like labelling
of the dims, written once per mesh axis:

    a: (batch..., m, k)   b: (batch..., k, n)   out: (batch..., m, n)

=========================== ========= =====================================================
 inputs                      output    why
=========================== ========= =====================================================
 B, B                        B         every rank computes the whole product
 S(batch), S(batch)          S(batch)  independent matrices (an operand broadcast along that
                                       batch dim stays B)
 S(m), B                     S(m)      rows of a give rows of out
 B, S(n)                     S(n)      columns of b give columns of out
 S(k), S(k)                  P         sum_r a[:, k_r] @ b[k_r, :] = a @ b
 P, B  /  B, P               P         the product is linear in each operand
=========================== ========= =====================================================

So ``S(0) @ B -> S(0)``, ``B @ S(1) -> S(1)``, ``S(1) @ S(0) -> P`` and, on a 2x2 mesh,
``(S(0), B) @ (B, S(1)) -> (S(0), S(1))`` run without communication.

Backward (``C = A' @ B'`` with ``A'``/``B'`` the possibly transposed operands):
``dA' = G @ B'^T`` and ``dB' = A'^T @ G``, each one more ``matmul`` with transpose flags,
then summed over broadcast batch dims. A 1-D operand is handled as a matrix with a size-1
dim inserted (``unreduce``) and removed again (a sum over that size-1 dim).
"""
from __future__ import annotations

import numpy as np

from ..dispatch import as_tensor
from ..registry import OPS
from ._rules import B, P, S, broadcast_shapes, defop, sig, widen
from .elementwise import sum_to
from .reduction import unreduce

__all__ = ["matmul", "matmul_t", "linear"]


# ----------------------------------------------------------------------------- labelling
def _labels(a_shape: tuple, b_shape: tuple, transpose_a: bool, transpose_b: bool,
            opname: str = "matmul"):
    """Label every dim of ``a``, ``b`` and the output; check sizes.

    Returns ``(a_labels, b_labels, out_labels, out_shape)``; batch labels are
    ``("batch", i)`` with ``i`` the output dim.
    """
    na, nb = len(a_shape), len(b_shape)
    if na == 0 or nb == 0:
        raise ValueError(f"{opname}: both operands need at least 1 dim, got shapes "
                         f"{tuple(a_shape)} and {tuple(b_shape)}; use * for scalars")
    a_mat = ["k"] if na == 1 else (["k", "m"] if transpose_a else ["m", "k"])
    b_mat = ["k"] if nb == 1 else (["n", "k"] if transpose_b else ["k", "n"])
    a_batch, b_batch = tuple(a_shape[:-2]), tuple(b_shape[:-2])
    batch = broadcast_shapes(opname, a_batch, b_batch) if (a_batch or b_batch) else ()
    nbatch = len(batch)
    a_labels = [("batch", i + nbatch - len(a_batch)) for i in range(len(a_batch))] + a_mat
    b_labels = [("batch", i + nbatch - len(b_batch)) for i in range(len(b_batch))] + b_mat
    ka = a_shape[a_labels.index("k")]
    kb = b_shape[b_labels.index("k")]
    if ka != kb:
        raise ValueError(f"{opname}: contracted dims differ: a has shape {tuple(a_shape)} and "
                         f"b has shape {tuple(b_shape)} ({ka} != {kb}); accepted: the last dim "
                         f"of a equals the second-to-last dim of b (the only dim of a 1-D b)")
    out_labels = [("batch", i) for i in range(nbatch)]
    out_shape = list(batch)
    if na >= 2:
        out_labels.append("m")
        out_shape.append(a_shape[a_labels.index("m")])
    if nb >= 2:
        out_labels.append("n")
        out_shape.append(b_shape[b_labels.index("n")])
    return a_labels, b_labels, out_labels, tuple(out_shape)


def _meta(layouts, transpose_a: bool = False, transpose_b: bool = False):
    a, b = layouts
    for name, l in (("a", a), ("b", b)):
        if l.dtype.kind not in "iufc":
            raise TypeError(f"matmul: argument '{name}' has dtype {l.dtype}; accepted: "
                            f"integer, floating or complex tensors")
    if a.dtype != b.dtype:  # PyTorch's rule: no promotion inside a product
        raise TypeError(f"matmul: expected both operands to have the same dtype, got "
                        f"{a.dtype} and {b.dtype} (PyTorch raises here too: a float32 layer "
                        f"fed float64 is a mistake, not a promotion); cast one, e.g. "
                        f"x.to(weight.dtype) or x.type_as(weight)")
    *_, shape = _labels(a.shape, b.shape, transpose_a, transpose_b)
    return [(shape, a.dtype)]


def _signatures(layouts, transpose_a: bool = False, transpose_b: bool = False):
    a, b = layouts
    al, bl, ol, out_shape = _labels(a.shape, b.shape, transpose_a, transpose_b)
    cands = [sig([B, B], B)]
    for d, label in enumerate(ol):
        if label in ("m", "n"):
            continue
        ins = []
        for l, labels in ((a, al), (b, bl)):
            pos = labels.index(label) if label in labels else None
            ins.append(S(pos) if pos is not None and l.shape[pos] == out_shape[d] else B)
        if any(s != B for s in ins):
            cands.append(sig(ins, S(d)))
    if "m" in ol:
        cands.append(sig([S(al.index("m")), B], S(ol.index("m"))))
    if "n" in ol:
        cands.append(sig([B, S(bl.index("n"))], S(ol.index("n"))))
    cands.append(sig([S(al.index("k")), S(bl.index("k"))], P))
    cands.append(sig([P, B], P))
    cands.append(sig([B, P], P))
    return cands


def _kernel(xp, a, b, transpose_a: bool = False, transpose_b: bool = False):
    if xp is np:  # NumPy has no float16 GEMM (a slow loop): float32 products, cast back
        a, b = widen(xp, a, b)
    if transpose_b and b.ndim >= 2:
        b = xp.swapaxes(b, -1, -2)
    if a.ndim > 2 and b.ndim == 2 and not transpose_a:
        # batch @ matrix as one (batch*m, k) @ (k, n) product: one large GEMM instead of a
        # loop of small ones
        flat = a.reshape(int(np.prod(a.shape[:-1])), a.shape[-1])
        return xp.matmul(flat, b).reshape(a.shape[:-1] + b.shape[-1:])
    if transpose_a and a.ndim >= 2:
        a = xp.swapaxes(a, -1, -2)
    return xp.matmul(a, b)


# ----------------------------------------------------------------------------- backward
def _unsqueeze(x, dim: int):
    """``x`` with a size-1 dim inserted at ``dim`` (``unreduce`` over a size-1 dim)."""
    shape = list(x.shape)
    shape.insert(dim, 1)
    return unreduce(x, (dim,), False, tuple(shape))


def _backward(ctx, g):
    a, b = ctx.inputs
    ta, tb = ctx.attrs.get("transpose_a", False), ctx.attrs.get("transpose_b", False)
    # 1-D operands as matrices: a (k,) -> (1, k); b (k,) -> (k, 1); g gains the same dims
    a2 = _unsqueeze(a, 0) if a.ndim == 1 else a
    b2 = _unsqueeze(b, 1) if b.ndim == 1 else b
    ta, tb = ta and a.ndim >= 2, tb and b.ndim >= 2
    g2 = g
    if a.ndim == 1:
        g2 = _unsqueeze(g2, g2.ndim - (1 if b.ndim >= 2 else 0))
    if b.ndim == 1:
        g2 = _unsqueeze(g2, g2.ndim)
    # dA' = G @ B'^T; if A was transposed, dA = dA'^T = B' @ G^T (only when A needs it: a
    # linear layer's input batch does not, and that product is as large as the others)
    ga = None
    if ctx.needs_grad(0):
        ga = matmul_t(g2, b2, False, not tb) if not ta else matmul_t(b2, g2, tb, True)
        ga = sum_to(ga, a2.shape)
    # dB' = A'^T @ G; if B was transposed, dB = dB'^T = G^T @ A'
    if b2.ndim == 2 and a2.ndim > 2 and not ta and ctx.needs_grad(1):
        # a matrix applied to a batch (a linear layer): contract the batch dims inside one
        # product, (batch*m, k)^T @ (batch*m, n), instead of a batch of products then a sum
        a2 = OPS.reshape(a2, -1, a2.shape[-1])
        g2 = OPS.reshape(g2, -1, g2.shape[-1])
    gb = None
    if ctx.needs_grad(1):
        gb = matmul_t(a2, g2, not ta, False) if not tb else matmul_t(g2, a2, True, ta)
        gb = sum_to(gb, b2.shape)
    if a.ndim == 1 and ga is not None:
        ga = OPS.sum(ga, dim=0)
    if b.ndim == 1 and gb is not None:
        gb = OPS.sum(gb, dim=1)
    return ga, gb


def _flops(in_shapes, out_shapes, transpose_a: bool = False, transpose_b: bool = False):
    """``2 * (output elements) * (contracted length)`` on one shard."""
    a = in_shapes[0]
    k = a[-1] if len(a) == 1 or not transpose_a else a[-2]
    return 2.0 * float(np.prod(out_shapes[0], dtype=np.float64)) * k


# ----------------------------------------------------------------------------- public
def _saves(grads: int, layouts: tuple) -> tuple:
    """dA reads B and dB reads A (not the product): keep what a needed gradient reads (both
    for a 1-D operand, which the backward reshapes)."""
    if any(len(l.shape) == 1 for l in layouts):
        return (0, 1)
    return ((1,) if grads & 1 else ()) + ((0,) if grads & 2 else ())


@defop(kernel=_kernel, meta=_meta, signatures=_signatures, backward=_backward, flops=_flops,
       method=True, saves=_saves, forwards=True)
def matmul(op, a, b):
    """Matrix product with NumPy/PyTorch semantics (``a @ b``): 1-D operands are vectors,
    leading (batch) dims broadcast.

    >>> y = x @ w      # x S(0), w B -> y S(0), no communication
    """
    return op(a, b)


def matmul_t(a, b, transpose_a: bool = False, transpose_b: bool = False):
    """``a' @ b'`` where ``a'``/``b'`` are ``a``/``b`` with their last two dims swapped when
    the flag is set (1-D operands ignore the flag): the matmul op with its transpose
    attributes, so no transpose op is run.

    >>> matmul_t(x, w, transpose_b=True)      # x @ w^T, as in a linear layer
    """
    a, b = as_tensor([a, b], "matmul")
    return matmul.op(a, b, transpose_a=bool(transpose_a and a.ndim >= 2),
                     transpose_b=bool(transpose_b and b.ndim >= 2))


@defop()
def linear(x, weight, bias=None):
    """``x @ weight^T + bias`` (weight ``(out, in)`` like PyTorch), computed without a
    transpose op: a column-split weight (S(0)) gives an output split on its last dim, a
    row-split weight (S(1)) with an input split on its last dim gives a partial output.

    >>> y = ct.linear(x, w, b)
    """
    y = matmul_t(x, weight, transpose_b=True)
    return y if bias is None else y + bias
