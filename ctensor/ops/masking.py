"""Masks computed from each shard's logical position: ``tril``, ``triu``, ``causal_fill``.

Each kernel builds its mask from the global row and column numbers of the region its shard
holds (``ctx.in_box``), so every split of every dim stays local:

================= ========================================================================
 op                signatures (1-D)
================= ========================================================================
 tril / triu       B->B; S(d)->S(d) for every dim d; P->P (zeroing is linear)
 causal_fill       B->B; S(d)->S(d) for every dim d; P->P when the fill value is 0
================= ========================================================================
"""
from __future__ import annotations

from .._args import int_args
from ..dispatch import as_tensor
from ._rules import B, P, S, defop, sig
from .shape import partial_signatures


def _one(opname: str, x):
    return as_tensor([x], opname)[0]


def _two_dims_meta(opname: str):
    def meta(layouts, **_):
        (x,) = layouts
        if x.ndim < 2:
            raise ValueError(f"{opname}: the input has shape {tuple(x.shape)}; accepted: "
                             f"tensors with at least 2 dims")
        return [(tuple(x.shape), x.dtype)]
    return meta


def _offsets(xp, ctx):
    """``col - row`` of every element of the shard's last two dims (global numbers)."""
    (r0, r1), (c0, c1) = ctx.in_region(0)[-2:]
    return xp.arange(c0, c1)[None, :] - xp.arange(r0, r1)[:, None]


# ----------------------------------------------------------------------------- tril / triu
def _tri_signatures(layouts, diagonal):
    (x,) = layouts
    return [sig([B], B)] + [sig([S(d)], S(d)) for d in range(x.ndim)] + \
        partial_signatures(layouts, (P,))


def _tri_kernel(upper: bool):
    def kernel(xp, x, diagonal, ctx):
        offset = _offsets(xp, ctx)
        keep = offset >= diagonal if upper else offset <= diagonal
        return xp.where(keep, x, xp.zeros((), dtype=x.dtype))
    return kernel


def _tri(op, x, diagonal):
    x = _one(op.name, x)
    (diagonal,) = int_args(op.name, "diagonal", (diagonal,))
    return op(x, diagonal=diagonal)


def _tri_declaration(upper: bool) -> dict:
    name = "triu" if upper else "tril"
    return dict(kernel=_tri_kernel(upper), meta=_two_dims_meta(name),
                signatures=_tri_signatures, needs_ctx=True,
                backward=lambda ctx, g: (ctx.op(g, **ctx.attrs),), method=True)


@defop(**_tri_declaration(upper=False))
def tril(op, x, diagonal: int = 0):
    """Lower triangle of the last two dims (elements with ``col - row <= diagonal``); works
    on every split without communication.

    >>> ct.tril(ct.ones(3, 3))
    """
    return _tri(op, x, diagonal)


@defop(**_tri_declaration(upper=True))
def triu(op, x, diagonal: int = 0):
    """Upper triangle of the last two dims (elements with ``col - row >= diagonal``).

    >>> ct.triu(x, 1)
    """
    return _tri(op, x, diagonal)


# ----------------------------------------------------------------------------- causal mask
def _causal_kernel(xp, x, value, diagonal, ctx):
    return xp.where(_offsets(xp, ctx) > diagonal, xp.asarray(value, dtype=x.dtype), x)


def _causal_signatures(layouts, value, **_):
    cands = [sig([B], B)] + [sig([S(d)], S(d)) for d in range(layouts[0].ndim)]
    return cands + ([sig([P], P)] if value == 0.0 else [])  # filling zeros is linear


@defop(kernel=_causal_kernel, meta=_two_dims_meta("causal_fill"), needs_ctx=True,
       signatures=_causal_signatures,
       backward=lambda ctx, g: (ctx.op(g, value=0.0, diagonal=ctx.attrs["diagonal"]),))
def causal_fill(op, x, value: float = float("-inf"), diagonal: int = 0):
    """``x`` with ``value`` where the column index exceeds the row index plus ``diagonal``
    (over the last two dims): the causal attention mask, computed from each shard's offsets,
    so any split of any dim stays local.

    >>> scores = ct.causal_fill(scores)          # -inf above the diagonal
    """
    x = _one("causal_fill", x)
    return op(x, value=float(value), diagonal=int(diagonal))
