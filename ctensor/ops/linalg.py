"""Matrix products: ``matmul`` (``a @ b``) with NumPy batching and 1-D operands; PyTorch's
fixed-rank forms (``mm bmm mv dot``), ``addmm``/``baddbmm``, ``outer``; and the
``ct.linalg`` norms (composites of sum and amax/amin, at the end of the file). The operands
of a product must share a dtype (``TypeError``, as PyTorch).

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

import math

from ..dispatch import OpDef, as_tensor
from ..registry import OPS
from ..tensor import Tensor
from ._rules import B, P, S, broadcast_shapes, defop, norm_dim, sig, split_along, widen
from .elementwise import sum_to
from .reduction import _sum_kernel, unreduce

__all__ = ["matmul", "matmul_t", "linear", "mm", "bmm", "mv", "dot", "addmm", "baddbmm",
           "outer", "ger", "vector_norm", "matrix_norm", "linalg_norm"]


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
    if b2.ndim == 2 and a2.ndim > 2 and not ta and ctx.needs_grad(1) and \
            not any(split_along(t._layout, d) for t in (a2, g2) for d in range(1, a2.ndim - 1)):
        # a matrix applied to a batch (a linear layer): contract the batch dims inside one
        # product, (batch*m, k)^T @ (batch*m, n), instead of a batch of products then a sum
        # (not when an inner batch dim is split, as the sequence under context parallelism:
        # the flattened dim would not stay split, the batch of products stays local)
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
    With a bias, a matrix weight and a batch input of one dtype it is one op (the product
    and the bias added in one kernel; in the backward one more product for the input and
    one kernel for both parameters' gradients), else the product and an ``add``.

    >>> y = ct.linear(x, w, b)
    """
    if bias is not None:
        x, weight, bias = as_tensor([x, weight, bias], "linear")
        if weight.ndim == 2 and bias.ndim == 1 and x.ndim >= 2 and \
                x.dtype == weight.dtype == bias.dtype:
            return _BIASED(x, weight, bias)
    y = matmul_t(x, weight, transpose_b=True)
    return y if bias is None else y + bias


# ----------------------------------------------------------------------------- linear, biased
# ``x (..., k) @ w (n, k)^T + b (n,)`` as one op: in a transformer a third of the ops of a
# step were a linear layer's bias add, its sum in the backward and the reshapes around the
# weight's gradient; the arithmetic is the product's and the add's, in their order (same bits)
def _biased_meta(layouts):
    x, w, b = layouts
    (shape, dtype), = _meta((x, w), transpose_b=True)
    if b.dtype != dtype or tuple(b.shape) != shape[-1:]:
        raise ValueError(f"linear: the bias has shape {tuple(b.shape)} and dtype {b.dtype}; "
                         f"expected {shape[-1:]} and {dtype} (one value per output feature)")
    return [(shape, dtype)]


def _biased_signatures(layouts):
    """The product's rules for a matrix weight, with the bias laid out as the output's last
    dim: split with a column-split weight, partial with a partial product (the bias then
    counted once: ``B -> P`` keeps it on one rank)."""
    r = len(layouts[0].shape) - 1
    return [sig([B, B, B], B)] + [sig([S(d), B, B], S(d)) for d in range(r)] + [
        sig([B, S(0), S(0)], S(r)), sig([S(r), S(1), P], P), sig([P, B, P], P),
        sig([B, P, P], P)]


def _biased_kernel(xp, x, w, b):
    y = _kernel(xp, x, w, transpose_b=True)
    if y.dtype != b.dtype:  # float16 on the host: the product as the matmul op returns it
        y = y.astype(b.dtype)
    y += b  # (a fresh array: the add in place, one pass and no temporary)
    return y


def _biased_backward(ctx, g):
    x, w, b = ctx.inputs
    gx = matmul_t(g, w) if ctx.needs_grad(0) else None  # (..., n) @ (n, k)
    gw = gb = None
    if ctx.needs_grad(1):
        gw, gb = _GRAD_PARAMS(x, g)
        gb = gb if ctx.needs_grad(2) else None
    elif ctx.needs_grad(2):
        gb = sum_to(g, b.shape)
    return gx, gw, gb


def _params_meta(layouts):
    x, g = layouts
    return [((g.shape[-1], x.shape[-1]), x.dtype), (g.shape[-1:], g.dtype)]


def _params_signatures(layouts):
    """``gw = g^T x`` and ``gb = sum g``, both contracting every leading dim: partial where
    one is split alike, split like the weight where a feature dim is."""
    r = len(layouts[0].shape) - 1
    return [sig([B, B], (B, B))] + [sig([S(d), S(d)], (P, P)) for d in range(r)] + [
        sig([S(r), B], (S(1), B)), sig([B, S(r)], (S(0), S(0))), sig([P, B], (P, B)),
        sig([B, P], (P, P))]


def _params_kernel(xp, x, g):
    """The weight's gradient as one ``(rows, n)^T @ (rows, k)`` product and the bias's as
    the sum op's kernel over the leading dims (the unfused backward's calls)."""
    rows = int(np.prod(g.shape[:-1]))  # (not -1: a shard may hold no features)
    gw = _kernel(xp, g.reshape(rows, g.shape[-1]), x.reshape(rows, x.shape[-1]),
                 transpose_a=True)
    return gw, _sum_kernel(xp, g, tuple(range(g.ndim - 1)), False)


def _params_flops(in_shapes, out_shapes):
    x, g = in_shapes
    return 2.0 * float(np.prod(x, dtype=np.float64)) * g[-1] + float(np.prod(g))


_BIASED = OpDef(
    "linear", _biased_kernel, _biased_meta, _biased_signatures, _biased_backward,
    flops=lambda ins, outs: _flops(ins[:2], outs, transpose_b=True) + float(np.prod(outs[0])),
    saves=lambda grads, layouts: ((1,) if grads & 1 else ()) + ((0,) if grads & 2 else ()))
_GRAD_PARAMS = _BIASED.grad_kernel("grad_params", _params_kernel, meta=_params_meta,
                                   signatures=_params_signatures, flops=_params_flops,
                                   saves=(), n_outputs=2)


# ----------------------------------------------------------------------------- PyTorch's forms
def _operands(opname: str, ndims: tuple, *tensors):
    """The operands as tensors, each checked to have its number of dims in ``ndims``."""
    tensors = as_tensor(tensors, opname)
    for i, (t, n) in enumerate(zip(tensors, ndims)):
        if t.ndim != n:
            kind = {1: "a vector (1-D)", 2: "a matrix (2-D)", 3: "a batch of matrices (3-D)"}[n]
            raise ValueError(f"{opname}: operand {i} has shape {tuple(t.shape)}; accepted: "
                             f"{kind} (matmul / @ broadcasts other shapes)")
    return tensors


@defop(method=True)
def mm(x, mat2):
    """The product of two matrices, ``(n, m) @ (m, p)`` (matmul without broadcasting).

    >>> ct.mm(a, b); a.mm(b)
    """
    return matmul(*_operands("mm", (2, 2), x, mat2))


@defop(method=True)
def bmm(x, mat2):
    """Batched matrix products, ``(b, n, m) @ (b, m, p)``, one batch size on both sides (a
    split batch dim stays split).

    >>> ct.bmm(q, k.transpose(1, 2))
    """
    x, mat2 = _operands("bmm", (3, 3), x, mat2)
    if x.shape[0] != mat2.shape[0]:
        raise ValueError(f"bmm: batch sizes differ: {tuple(x.shape)} and {tuple(mat2.shape)}; "
                         f"accepted: equal first dims")
    return matmul(x, mat2)


@defop(method=True)
def mv(x, vec):
    """Matrix times vector, ``(n, m) @ (m,)``."""
    return matmul(*_operands("mv", (2, 1), x, vec))


@defop(method=True)
def dot(x, other):
    """The inner product of two vectors of one length (a 0-d tensor)."""
    return matmul(*_operands("dot", (1, 1), x, other))


def _scaled_sum(opname: str, base, product, beta, alpha):
    """``beta * base + alpha * product`` (PyTorch's addmm rule: with beta 0, ``base`` is not
    read, so a nan in it does not reach the result)."""
    for name, v in (("beta", beta), ("alpha", alpha)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.number)):
            raise TypeError(f"{opname}: argument '{name}' must be a number, got {v!r}")
    out = product if alpha == 1 else product * alpha
    if beta == 0:
        broadcast_shapes(opname, tuple(base.shape), tuple(out.shape))
        return out
    return out + (base if beta == 1 else base * beta)


@defop(method=True)
def addmm(input, mat1, mat2, *, beta=1, alpha=1):  # noqa: A002 - PyTorch's names
    """``beta * input + alpha * (mat1 @ mat2)`` for matrices (``input`` broadcasts).

    >>> ct.addmm(bias, x, w)               # bias + x @ w
    """
    (input,) = as_tensor([input], "addmm")
    return _scaled_sum("addmm", input, mm(mat1, mat2), beta, alpha)


@defop(method=True)
def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):  # noqa: A002 - PyTorch's names
    """``beta * input + alpha * bmm(batch1, batch2)`` (``input`` broadcasts): attention's
    scores with a mask added, ``ct.baddbmm(mask, q, k.mT, alpha=scale)``."""
    (input,) = as_tensor([input], "baddbmm")
    return _scaled_sum("baddbmm", input, bmm(batch1, batch2), beta, alpha)


@defop(method=True)
def outer(x, vec2):
    """The outer product of two vectors, ``out[i, j] = x[i] * vec2[j]`` (a broadcast
    product: a split vector gives a split row or column dim, no communication).

    >>> ct.outer(positions, inv_freq)       # rotary embedding angles
    """
    x, vec2 = _operands("outer", (1, 1), x, vec2)
    return OPS.unsqueeze(x, 1) * OPS.unsqueeze(vec2, 0)


@defop(method=True)
def ger(x, vec2):
    """The same as :func:`outer` (PyTorch's older name)."""
    return outer(x, vec2)


# ----------------------------------------------------------------------------- linalg norms
def _norm_input(opname: str, x) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{opname}: expected a ct.Tensor, got {type(x).__name__}")
    if x.dtype.kind not in "f":
        raise TypeError(f"{opname}: the input has dtype {x.dtype}; accepted: floating tensors "
                        f"(as in PyTorch); convert it with .float()")
    return x


@defop("linalg.vector_norm")
def vector_norm(x, ord=2, dim=None, keepdim: bool = False, *, dtype=None):  # noqa: A002
    """``ct.linalg.vector_norm``: the ``ord``-norm of the elements over ``dim`` (int, tuple,
    or None for all): 2 (default), 1, inf, -inf, 0 (a count), other floats; a composite of
    sum / amax (a split reduced dim gives partial sums, never a gather).

    >>> ct.linalg.vector_norm(x, dim=-1)
    """
    x = _norm_input("linalg.vector_norm", x)
    if dtype is not None:
        x = x.to(dtype)
    if isinstance(ord, str) or isinstance(ord, bool) or \
            not isinstance(ord, (int, float, np.number)):
        raise ValueError(f"linalg.vector_norm: argument 'ord' is {ord!r}; accepted: a number "
                         f"(2, 1, inf, -inf, 0 or any float)")
    return OPS.norm(x, float(ord), dim, keepdim)


def _matrix_dims(opname: str, x, dim) -> tuple:
    if not isinstance(dim, (tuple, list)) or len(dim) != 2:
        raise ValueError(f"{opname}: argument 'dim' is {dim!r}; accepted: a pair of dims")
    if x.ndim < 2:
        raise ValueError(f"{opname}: the input has shape {tuple(x.shape)}; accepted: at "
                         f"least 2 dims (a matrix)")
    d0, d1 = (norm_dim(opname, d, x.ndim) for d in dim)
    if d0 == d1:
        raise ValueError(f"{opname}: argument 'dim' {tuple(dim)} names one dim twice")
    return d0, d1


_MATRIX_ORDS = ("fro", 1, -1, math.inf, -math.inf)


@defop("linalg.matrix_norm")
def matrix_norm(x, ord="fro", dim=(-2, -1), keepdim: bool = False):  # noqa: A002
    """``ct.linalg.matrix_norm``: a norm of the matrices in the dims ``dim``: ``"fro"``
    (default, ``sqrt(sum x^2)``), ``1`` / ``-1`` (largest / smallest column sum of absolute
    values), ``inf`` / ``-inf`` (largest / smallest row sum). Written with sum and amax /
    amin, so splits of either dim give partial results, never a gather. The spectral and
    nuclear norms (``2``, ``-2``, ``"nuc"``) need singular values and are not offered.

    >>> ct.linalg.matrix_norm(w, ord=1)
    """
    x = _norm_input("linalg.matrix_norm", x)
    rows, cols = _matrix_dims("linalg.matrix_norm", x, dim)
    if ord not in _MATRIX_ORDS or isinstance(ord, bool):
        raise ValueError(f"linalg.matrix_norm: argument 'ord' is {ord!r}; accepted: 'fro', "
                         f"1, -1, inf, -inf (the singular-value norms 2, -2 and 'nuc' are not "
                         f"offered: they need an SVD)")
    if ord == "fro":
        return OPS.norm(x, 2, (rows, cols), keepdim)
    # ord 1: the largest column sum (sum over rows, then the extreme over columns); inf: the
    # largest row sum
    summed, over = (rows, cols) if ord in (1, -1) else (cols, rows)
    sums = OPS.sum(OPS.abs(x), dim=summed, keepdim=True)
    pick = OPS.amax if ord in (1, math.inf) else OPS.amin
    out = pick(sums, dim=over, keepdim=True)
    return out if keepdim else OPS.squeeze(out, (rows, cols))


@defop("linalg.norm")
def linalg_norm(x, ord=None, dim=None, keepdim: bool = False):  # noqa: A002
    """``ct.linalg.norm`` (PyTorch's rules): with ``dim`` an int, or ``dim`` and ``ord``
    both None, a vector norm (the 2-norm of all elements by default); with ``dim`` a pair,
    or ``ord`` given for a 2-D input without ``dim``, a matrix norm (``ord`` None is
    ``"fro"``); ``ord`` given for a 1-D input without ``dim``, a vector norm.

    >>> ct.linalg.norm(x); ct.linalg.norm(x, dim=-1); ct.linalg.norm(w, ord=float("inf"))
    """
    x = _norm_input("linalg.norm", x)
    matrix = isinstance(dim, (tuple, list)) and len(dim) == 2 or \
        (dim is None and ord is not None and x.ndim == 2)
    if dim is None and ord is not None and x.ndim not in (1, 2):
        raise ValueError(f"linalg.norm: 'ord' {ord!r} without 'dim' needs a 1-D or 2-D "
                         f"input, got shape {tuple(x.shape)}; pass dim= (or use "
                         f"ct.linalg.vector_norm)")
    if matrix:
        return matrix_norm(x, "fro" if ord is None else ord,
                           (-2, -1) if dim is None else tuple(dim), keepdim)
    if ord == "fro":
        ord = 2
    return vector_norm(x, 2 if ord is None else ord, dim, keepdim)
