"""``einsum(equation, *operands)``: Einstein summation, with SBP rules read off the labels.

The equation is normalised once (``...`` replaced by letters, the implicit output made
explicit: NumPy's rule) and becomes the op's attribute. Signatures (1-D), per label ``L``
that no operand repeats:

====================================== ================= ====================================
 inputs                                 output            why
====================================== ================= ====================================
 all B                                  B                 every rank computes everything
 S(dim of L) in every operand with L,   S(dim of L in     independent slices, as S(batch) in
 B in the others; L kept in the output  the output)       matmul
 the same, L contracted (not in the     P                 sum_r (the sum over part r of L) is
 output)                                                  the sum over L, as S(k) @ S(k) -> P
 P in one operand, B in the others      P                 einsum is linear in each operand
====================================== ================= ====================================

So ``einsum("ij,jk->ik", a, b)`` has matmul's rules (``S(1), S(0) -> P``), ``"bij,bjk->bik"``
keeps a batch split, ``"ij->ji"`` moves a split with its dim and ``"ii->"`` (a trace) runs on
gathered input (a repeated label is never split: a shard's diagonal would need its offset).

Backward, for operand ``k`` with labels ``s_k``: ``einsum("out,others->s_k", g, *others)``
(every other operand as it is), then broadcast over labels only ``s_k`` has (summed in the
forward, so the gradient is constant along them), then put on the diagonal of repeated
labels (an einsum with identity matrices). Ellipsis dims must match exactly across operands
(no size-1 broadcasting).
"""
from __future__ import annotations

import functools
import string
from typing import Sequence

import numpy as np

from ..dispatch import as_tensor
from ._rules import B, P, S, defop, result_dtype, sig

__all__ = ["einsum"]

_LETTERS = string.ascii_letters


def _fail(equation: str, why: str) -> ValueError:
    return ValueError(f"einsum: equation {equation!r} {why}")


@functools.lru_cache(maxsize=1024)
def normalize(equation: str, shapes: tuple) -> str:
    """``equation`` for operands of ``shapes`` as ``"ab,bc->ac"``: letters only (``...``
    expanded), the output explicit; ``ValueError`` naming what is wrong."""
    eq = equation.replace(" ", "")
    if eq.count("->") > 1:
        raise _fail(equation, "has more than one '->'")
    lhs, out = eq.split("->") if "->" in eq else (eq, None)
    subs = lhs.split(",")
    if len(subs) != len(shapes):
        raise _fail(equation, f"names {len(subs)} operands but {len(shapes)} were given")
    for part in subs + ([out] if out is not None else []):
        if any(c not in _LETTERS for c in part.replace("...", "")):
            raise _fail(equation, f"has the subscripts {part!r}; accepted: letters a-z, A-Z "
                                  f"and one '...' per operand")
        if part.count("...") > 1:
            raise _fail(equation, f"has more than one '...' in {part!r}")
    fresh = [c for c in _LETTERS if c not in eq]
    ellipsis_dims = max([len(s) - len(sub) + 3 for sub, s in zip(subs, shapes)
                         if "..." in sub] or [0])
    ellipsis = "".join(fresh[:ellipsis_dims])
    expanded = []
    for i, (sub, shape) in enumerate(zip(subs, shapes)):
        if "..." in sub:
            k = len(shape) - len(sub) + 3
            if k < 0:
                raise _fail(equation, f"gives operand {i} more labels than its {len(shape)} "
                                      f"dims (shape {tuple(shape)})")
            sub = sub.replace("...", ellipsis[ellipsis_dims - k:])
        if len(sub) != len(shape):
            raise _fail(equation, f"labels operand {i} with {sub!r} ({len(sub)} dims) but it "
                                  f"has shape {tuple(shape)}")
        expanded.append(sub)
    sizes: dict = {}
    for i, (sub, shape) in enumerate(zip(expanded, shapes)):
        for label, n in zip(sub, shape):
            if sizes.setdefault(label, n) != n:
                shown = "an ellipsis dim" if label in ellipsis else f"label {label!r}"
                raise _fail(equation, f"gives {shown} size {n} in operand {i} and "
                                      f"{sizes[label]} before; accepted: equal sizes "
                                      f"(ctensor's einsum does not broadcast size-1 dims)")
    labels = "".join(expanded)
    if out is None:
        out = ellipsis + "".join(sorted(c for c in set(labels)
                                        if labels.count(c) == 1 and c not in ellipsis))
    else:
        if "..." not in out and ellipsis:
            raise _fail(equation, "has '...' in its operands but not in its output")
        out = out.replace("...", ellipsis)
        for c in out:
            if c not in labels:
                raise _fail(equation, f"has the output label {c!r}, which no operand has")
            if out.count(c) > 1:
                raise _fail(equation, f"repeats the output label {c!r}")
    return ",".join(expanded) + "->" + out


def _parts(equation: str) -> tuple:
    lhs, out = equation.split("->")
    return lhs.split(","), out


def _meta(layouts, equation):
    subs, out = _parts(equation)
    sizes = {c: n for sub, l in zip(subs, layouts) for c, n in zip(sub, l.shape)}
    return [(tuple(sizes[c] for c in out), result_dtype("einsum", [l.dtype for l in layouts]))]


def _signatures(layouts, equation):
    subs, out = _parts(equation)
    n = len(subs)
    cands = [sig([B] * n, B)]
    for label in dict.fromkeys("".join(subs)):
        if any(sub.count(label) > 1 for sub in subs):
            continue  # a repeated label (a diagonal) is never split
        ins = [S(sub.index(label)) if label in sub else B for sub in subs]
        cands.append(sig(ins, S(out.index(label)) if label in out else P))
    cands += [sig([P if j == i else B for j in range(n)], P) for i in range(n)]
    return cands


def _kernel(xp, *arrays, equation):
    out = xp.einsum(equation, *arrays, optimize=len(arrays) > 1)
    return out.copy() if len(arrays) == 1 else out  # a view (a read-only diagonal) no more


def _operand_grad(g, inputs: Sequence, k: int, subs: list, out: str):
    """The gradient of operand ``k`` (see the module docstring)."""
    sub = subs[k]
    unique = "".join(dict.fromkeys(sub))
    others = [j for j in range(len(subs)) if j != k]
    available = set(out).union(*(subs[j] for j in others))
    target = "".join(c for c in unique if c in available)
    equation = ",".join([out] + [subs[j] for j in others]) + "->" + target
    grad = einsum.op(g, *[inputs[j] for j in others], equation=equation)
    sizes = dict(zip(sub, inputs[k].shape))
    if target != unique:  # labels only operand k has: the gradient is constant along them
        grad = grad.reshape(tuple(sizes[c] if c in target else 1 for c in unique))
        grad = grad.expand(*[sizes[c] for c in unique])
    if unique != sub:  # repeated labels: the gradient lies on their diagonal
        fresh = iter(c for c in _LETTERS if c not in sub + out)
        renamed, deltas, seen = "", [], set()
        for c in sub:
            if c in seen:
                new = next(fresh)
                deltas.append((c, new))
                renamed += new
            else:
                seen.add(c)
                renamed += c
        eyes = as_tensor([grad] + [np.eye(sizes[c], dtype=grad.dtype) for c, _ in deltas],
                         "einsum")[1:]
        equation = ",".join([unique] + [c + new for c, new in deltas]) + "->" + renamed
        grad = einsum.op(grad, *eyes, equation=equation)
    return grad


def _backward(ctx, g):
    subs, out = _parts(ctx.attrs["equation"])
    return tuple(_operand_grad(g, ctx.inputs, k, subs, out) if t.dtype.kind in "fc" else None
                 for k, t in enumerate(ctx.inputs))


@defop(kernel=_kernel, meta=_meta, signatures=_signatures, backward=_backward)
def einsum(op, equation: str, *operands):
    """Einstein summation over ``operands`` (tensors, or one list of them), NumPy/PyTorch
    notation: ``"ij,jk->ik"`` (matrix product), ``"bij,bjk->bik"`` (batched), ``"ij->ji"``
    (transpose), ``"ii->"`` (trace), ``"i,i->"`` (dot), ``"...ij->...ji"``; without ``->``
    the output is the labels used once, sorted. Splits follow the labels: a split
    contracted label gives a partial sum (P), a split kept label stays split.

    >>> ct.einsum("ij,jk->ik", a, b)        # a S(1), b S(0) -> P, no communication
    """
    if not isinstance(equation, str):
        raise TypeError(f"einsum: argument 'equation' must be a str, got "
                        f"{type(equation).__name__}")
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise ValueError("einsum: no operands given; accepted: one or more tensors")
    operands = as_tensor(operands, "einsum")
    normalized = normalize(equation, tuple(tuple(t.shape) for t in operands))
    return op(*operands, equation=normalized)
