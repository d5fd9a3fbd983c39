"""``softmax`` and ``log_softmax`` along one dim.

One op, ``softmax`` (attribute ``log``), with two ways to run, chosen by cost per layout:

* the fused kernel (one pass forward, one backward through ``softmax.grad``) when no mesh
  axis splits ``dim``: B->B and S(e)->S(e) for e != dim; its grad also P,B->P (linear in
  the incoming gradient);
* the composite for a split along ``dim`` (S(dim)->S(dim)): the max is a reduction over
  ranks (P(max)), the sum of exponentials another (P); only row statistics move, the input
  is never gathered.
"""
from __future__ import annotations

from ..dispatch import as_tensor
from ..registry import OPS
from ._rules import B, P, S, defop, norm_dim, reduced, row_stats_comm, sig, widen, widened


def _kernel(xp, x, dim, log):
    if x.size == 0:
        return x.copy()
    x = widen(xp, x)  # float16: the max, exponentials and their sum in float32
    z = x - xp.max(x, axis=dim, keepdims=True)
    e = xp.exp(z)
    s = xp.sum(e, axis=dim, keepdims=True)
    return z - xp.log(s) if log else e / s


def _grad_kernel(xp, g, y, dim, log):
    g, y = widen(xp, g, y)
    if log:  # y = log_softmax(x): dx = g - softmax(x) * sum(g)
        return g - xp.exp(y) * xp.sum(g, axis=dim, keepdims=True)
    return y * (g - xp.sum(g * y, axis=dim, keepdims=True))


def float_meta(opname: str):
    """Output like the last input; ``TypeError`` unless it is floating."""
    def meta(layouts, **_):
        x = layouts[-1]
        if x.dtype.kind not in "fc":
            raise TypeError(f"{opname}: the input must be a floating tensor, got {x.dtype}; "
                            f"convert it with .float()")
        return [(tuple(x.shape), x.dtype)]
    return meta


_comm = row_stats_comm(2, lambda x, attrs: (attrs["dim"],))  # the max and the sum


def _signatures(layouts, dim, **_):
    n = len(layouts)
    cands = [sig([B] * n, B)] + [sig([S(e)] * n, S(e))
                                 for e in range(layouts[0].ndim) if e != dim]
    if n == 2:  # the grad kernel (g, y) is linear in g
        cands.append(sig([P, B], P))
    elif layouts[0].ndim:
        cands.append(sig([S(dim)], S(dim), composite=True, comm=_comm))
    return cands


@widened
def _composite(x, dim, log):
    """Softmax from reductions over ranks: a split along ``dim`` stays split."""
    z = x - reduced(OPS.amax(x, dim=dim, keepdim=True)).detach()
    e = OPS.exp(z)
    s = reduced(OPS.sum(e, dim=dim, keepdim=True))
    return z - OPS.log(s) if log else e / s


def _front(op, name: str, x, dim: int, log: bool):
    (x,) = as_tensor([x], name)
    if x.dtype.kind not in "fc":
        raise TypeError(f"{name}: the input must be a floating tensor, got {x.dtype}; "
                        f"convert it with .float()")
    dim = norm_dim(name, dim, x.ndim)
    if x.ndim == 0:
        return OPS.zeros_like(x) + (0.0 if log else 1.0) + x * 0.0
    return op(x, dim=dim, log=log)


@defop(kernel=_kernel, meta=float_meta("softmax"), signatures=_signatures,
       composite=_composite, method=True,
       backward=lambda ctx, g: (ctx.op.grads["grad"](g, ctx.outputs[0], **ctx.attrs),))
def softmax(op, x, dim: int):
    """``exp(x) / sum(exp(x), dim)``, numerically stable (the max is subtracted).

    A split along other dims stays local (one fused kernel); a split along ``dim`` runs as
    a max (P(max)) and a sum (P) over ranks, never gathering ``x``.

    >>> p = ct.softmax(scores, dim=-1)
    """
    return _front(op, "softmax", x, dim, False)


softmax.op.grad_kernel("grad", _grad_kernel, meta=float_meta("softmax"),
                       signatures=_signatures)


@defop(method=True)
def log_softmax(x, dim: int):
    """``x - log(sum(exp(x), dim))``, numerically stable; splits as :func:`softmax`.

    >>> logp = ct.log_softmax(logits, dim=-1)
    """
    return _front(softmax.op, "log_softmax", x, dim, True)
